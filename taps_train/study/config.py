"""What a study YAML says (configs/study/*.yaml): one dataclass field per key, parsed by jsonargparse.

A study is the TAPS comparison at one scale: every backbone trained on every domain (specialists) and
every mixture recipe, each drafter evaluated alone, every strategy over the specialists, and a λ sweep of
weight averaging, all at every temperature on the domains' held-out benchmarks.
"""

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from taps_train.errors import TapsError
from taps_train.eval.benchmarks import BENCHMARKS
from taps_train.spec.strategies import STRATEGIES


@dataclass
class Domain:
    """A domain: the recipe its specialist trains on and the held-out benchmarks that measure it."""

    recipe: str
    benchmarks: list[str]


@dataclass
class Tree:
    """The draft tree every evaluation uses (`taps-train eval --total-tokens --depth --top-k`)."""

    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10


@dataclass
class Study:
    """name: the study's folder under `out_root`. backbones: backbone name -> a `taps-train fit` config whose
    model, optimizer and callbacks every cell of that backbone uses (recipe, steps, seed, verifier and output
    folders are the study's). max_steps: every fit's budget (None: each config's own, e.g. the paper's 20 epochs). mixtures: name -> a mixture recipe, trained by every backbone. strategies: how
    the specialists are combined (`taps-train eval --strategy`; `average` is uniform). lambdas: weights of the
    first domain's specialist in a two-domain averaging sweep. prompts, max_new_tokens: per benchmark, for
    every evaluation. baseline: every evaluation also decodes its prompts plainly, for the speedup next to τ
    (about doubles evaluation time)."""

    name: str
    domains: dict[str, Domain]
    backbones: dict[str, str]
    verifier: str = "taps-tiny"
    mixtures: dict[str, str] = field(default_factory=dict)
    max_steps: int | None = 500
    strategies: list[str] = field(default_factory=lambda: ["average", "route-entropy", "route-confidence", "merge", "merge-budget"])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    tree: Tree = field(default_factory=Tree)
    prompts: int = 20
    max_new_tokens: int = 64
    baseline: bool = True
    lambdas: list[float] = field(default_factory=list)
    seed: int = 0
    out_root: str = "checkpoints/studies"

    @property
    def out_dir(self) -> Path:
        return Path(self.out_root) / self.name

    @property
    def benchmarks(self) -> list[str]:
        """Every domain's benchmarks, in domain order, each once."""
        return list(dict.fromkeys(name for domain in self.domains.values() for name in domain.benchmarks))

    def check(self) -> None:
        """Refuse what would fail hours in: missing files, unknown strategies, impossible sweeps."""
        problems = []
        if len(self.domains) < 2:
            problems.append(f"domains: a study compares specialists of two or more domains, got {len(self.domains)}")
        if not self.backbones:
            problems.append("backbones: name at least one backbone and its fit config")
        names = [*self.domains, *self.mixtures]
        if len(set(names)) != len(names):
            problems.append(f"domains and mixtures share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
        for name in [self.name, *names, *self.backbones]:
            if not name.replace("_", "").replace("-", "").isalnum():
                problems.append(f"{name!r}: names become folder names; use letters, digits, - and _")
        for name, domain in self.domains.items():
            if not domain.benchmarks:
                problems.append(f"domains.{name}.benchmarks: name at least one held-out benchmark")
            for spec in domain.benchmarks:
                benchmark, _, path = spec.partition(":")
                if benchmark not in BENCHMARKS:
                    problems.append(f"domains.{name}.benchmarks: unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
                elif path and not Path(path).is_file():
                    problems.append(f"domains.{name}.benchmarks: {spec}: {path} does not exist")
        files = {f"domains.{n}.recipe": d.recipe for n, d in self.domains.items()}
        files |= {f"mixtures.{n}": path for n, path in self.mixtures.items()}
        files |= {f"backbones.{n}": path for n, path in self.backbones.items()}
        problems += [f"{key}: {path} does not exist (relative paths start at the current directory)"
                     for key, path in files.items() if not Path(path).is_file()]
        problems += [f"backbones.{n}: {path} is not a fit config with model and data sections"
                     for n, path in self.backbones.items() if Path(path).is_file() and not _is_fit_config(path)]
        known = sorted({*STRATEGIES, "average"} - {"single"})
        unknown = [s for s in self.strategies if s not in known]
        if unknown:
            problems.append(f"strategies: {unknown} are not composition strategies; use {known}")
        if self.lambdas and len(self.domains) != 2:
            problems.append(f"lambdas: a λ sweep interpolates two specialists; this study has {len(self.domains)} domains")
        if any(not 0 <= value <= 1 for value in self.lambdas):
            problems.append(f"lambdas: every λ lies in [0, 1], got {self.lambdas}")
        if (self.max_steps is not None and self.max_steps < 1) or self.prompts < 1 or self.max_new_tokens < 1 or not self.temperatures:
            problems.append("max_steps, prompts and max_new_tokens must be >= 1 and temperatures not empty")
        if any(t < 0 for t in self.temperatures):
            problems.append(f"temperatures: every temperature is >= 0, got {self.temperatures}")
        if problems:
            raise TapsError(f"study {self.name}: " + "; ".join(problems))


def check_study_file(path: str) -> None:
    """A readable YAML mapping, or one line naming the file (before jsonargparse, which would print a foreign file)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise TapsError(f"cannot read study file {path}: {err.strerror or err}; pass a study YAML (see configs/study/)") from err
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as err:
        raise TapsError(f"study file {path} is not valid YAML ({type(err).__name__}); pass a study YAML (see configs/study/)") from err
    if not isinstance(data, dict):
        raise TapsError(f"study file {path} is not a YAML mapping of study keys (name, domains, backbones, ...); see configs/study/")


def _is_fit_config(path: str) -> bool:
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model"), dict) and isinstance(config.get("data"), dict)
