"""Weights & Biases tracking that never blocks a run: training logger and eval-report upload.

W&B needs credentials and a reachable server. Rather than letting `wandb.init` prompt for a key,
wait for a timeout or raise, every run here starts offline when either is missing (or when online
start-up fails), says so in one line with the run directory, and can be uploaded later with
`wandb sync DIR`.
"""

import netrc
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from taps_train.errors import TapsError
from taps_train.eval.report import read_report

DEFAULT_HOST = "https://api.wandb.ai"
PROBE_SECONDS = 3.0


def offline_reason(mode: str | None) -> str | None:
    """Why this process should log offline; None when online is worth trying (or W&B is disabled)."""
    mode = mode or os.environ.get("WANDB_MODE")
    if mode in ("offline", "dryrun"):
        return f"mode {mode} requested"
    if mode == "disabled":
        return None
    url = urlsplit(os.environ.get("WANDB_BASE_URL", DEFAULT_HOST))
    host = url.hostname or ""
    if not _has_credentials(host):
        return "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
    if not _reachable(url.scheme, host, url.port):
        return f"{host} is not reachable"
    return None


def _has_credentials(host: str) -> bool:
    """An API key in the environment, an identity-token file, or a netrc entry for the host (where `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        return netrc.netrc(os.environ.get("NETRC", Path.home() / ".netrc")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _reachable(scheme: str, host: str, port: int | None) -> bool:
    """A TCP connection to the server (or its proxy) within PROBE_SECONDS, DNS included.

    The probe runs in a daemon thread because name resolution ignores socket timeouts.
    """
    target = (host, port or (443 if scheme == "https" else 80))
    proxy = getproxies().get(scheme)
    if proxy and not proxy_bypass(host):
        proxy_url = urlsplit(proxy)
        target = (proxy_url.hostname or "", proxy_url.port or 80)
    connected: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(target, timeout=PROBE_SECONDS).close()
            connected.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS)
    return bool(connected)


def start_run(init: Callable[[str | None], Any], mode: str | None = None) -> Any:
    """Call `init(mode)` online when possible, else (or when online start-up raises) with mode offline."""
    from wandb.errors import Error

    reason = offline_reason(mode)
    try:
        run = init("offline" if reason else mode)
    except Error as err:
        if reason:
            raise
        reason = f"online start failed: {err}"
        run = init("offline")
    if reason:
        run_dir = Path(run.dir).parent
        rank_zero_info(f"W&B logging offline: {reason}; run saved in {run_dir}; upload later with `wandb sync {run_dir}`")
    return run


class TapsWandbLogger(WandbLogger):
    """Lightning's WandbLogger that falls back to offline logging and tags runs with backbone and recipe.

    Tags come from the hyperparameters Lightning logs at fit start, so they follow command-line
    overrides and sweeps instead of repeating the config by hand.
    """

    def __init__(
        self,
        project: str = "taps-train",
        name: str | None = None,
        save_dir: str = ".",
        tags: list[str] | None = None,
        offline: bool = False,
        log_model: bool | Literal["all"] = False,
        **kwargs: Any,
    ):
        """
        Args:
            project: W&B project.
            name: run name (default: W&B's generated name, e.g. under a sweep).
            save_dir: the run directory lands in `<save_dir>/wandb/`.
            tags: extra tags; `hass`/`eagle2` and the recipe name are added at fit start.
            offline: always log offline (upload later with `wandb sync`).
            log_model: upload checkpoints as artifacts (True: at the end, "all": as they are written).
            **kwargs: passed to `wandb.init` (entity, group, notes, ...).
        """
        # Configs spell out every wandb.init argument, unset ones as None. Unset stays unset: Lightning's
        # defaults hold (resume="allow") and wandb does not warn about settings nobody set (anonymous).
        # Offline goes to wandb.init as its mode: Lightning's own flag would set WANDB_MODE process-wide.
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        mode = "offline" if offline else kwargs.pop("mode", None)
        super().__init__(project=project, name=name, save_dir=save_dir, log_model=log_model, tags=list(tags or []), mode=mode, **kwargs)
        self._wandb_init = {key: value for key, value in self._wandb_init.items() if value is not None}

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        import wandb

        if self._experiment is None and wandb.run is None:
            Path(self.save_dir).mkdir(parents=True, exist_ok=True)
            return start_run(self._start, self._wandb_init.get("mode"))
        return super().experiment

    def _start(self, mode: str | None) -> Any:
        self._wandb_init["mode"] = mode
        return super().experiment

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Any) -> None:
        super().log_hyperparams(params)
        run = self.experiment
        run.tags = tuple(dict.fromkeys([*run.tags, *run_tags(params if isinstance(params, Mapping) else vars(params))]))


def run_tags(hparams: Mapping[str, Any]) -> list[str]:
    """Training method (`hass`/`eagle2`/..., see `method_of`) and recipe tags from module + datamodule hyperparameters."""
    from taps_train.training.base import method_of

    backbone = method_of(hparams)
    tags = [backbone] if backbone else []
    if hparams.get("recipe"):
        tags.append(Path(str(hparams["recipe"])).stem)
    return tags


def log_eval_reports(project: str, paths: Iterable[str | Path]) -> Path:
    """One W&B run (job type `eval`) for the report files of one `taps-train eval` call.

    Logs τ per benchmark and temperature (summary and table), acceptance rate by depth (table and
    line plot), routing counts when present, and the JSON files as an `eval-report` artifact.
    Every file is read and checked before W&B starts. Returns the local run directory.
    """
    import wandb

    reports = {Path(path): read_report(path) for path in paths}
    if not reports:
        raise TapsError("no eval reports to log to W&B; pass the JSON files written by `taps-train eval`")
    first_path, first = next(iter(reports.items()))
    config = {key: first.as_dict().get(key) for key in ("verifier", "drafters", "strategy", "tree", "weights")}
    run = start_run(lambda mode: wandb.init(project=project, job_type="eval", dir=str(first_path.parent), config=config,
                                            tags=["eval", first.strategy], mode=mode))
    tau = wandb.Table(columns=["temperature", "benchmark", "acceptance_length", "mean_tree_tokens", "verify_calls", "new_tokens", "prompts", "wall_time_s",
                                "tokens_per_s", "baseline_tokens_per_s", "speedup"])
    depth = wandb.Table(columns=["series", "temperature", "benchmark", "depth", "accept_rate"])
    routing = wandb.Table(columns=["temperature", "benchmark", "drafter", "rounds"])
    for report in reports.values():
        t = report.temperature
        run.summary[f"tau/average/T{t:g}"] = report.average_acceptance_length
        for name, result in report.benchmarks.items():
            run.summary[f"tau/{name}/T{t:g}"] = result.acceptance_length
            if result.speedup is not None:
                run.summary[f"speedup/{name}/T{t:g}"] = result.speedup
            tau.add_data(t, name, *(getattr(result, column) for column in tau.columns[2:]))
            for d, rate in enumerate(result.accept_rate_by_depth, start=1):
                depth.add_data(f"{name} T={t:g}", t, name, d, rate)
            for drafter, rounds in (result.routing or {}).items():
                routing.add_data(t, name, drafter, rounds)
    logged = {"eval/tau": tau, "eval/accept_rate_by_depth": depth,
              "eval/accept_rate_by_depth_plot": wandb.plot.line(depth, "depth", "accept_rate", stroke="series", title="acceptance rate by depth")}
    if routing.data:
        logged["eval/routing"] = routing
    run.log(logged)
    artifact = wandb.Artifact(f"eval-report-{first.strategy}", type="eval-report", metadata=config)
    for path in reports:
        artifact.add_file(str(path))
    run.log_artifact(artifact)
    run_dir = Path(run.dir).parent
    run.finish()
    return run_dir
