"""W&B sweep definitions (configs/sweeps/): every swept key is a LightningCLI config key, and the
command the W&B agent would run for a sampled point parses."""

import math
import random
from pathlib import Path

import pytest
import yaml
from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

from taps_train.cli import main
from taps_train.data.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


def sample(parameter: dict, rng: random.Random):
    """One value of a W&B sweep parameter (the distributions these sweeps use)."""
    if "value" in parameter:
        return parameter["value"]
    if "values" in parameter:
        return rng.choice(parameter["values"])
    if parameter.get("distribution") == "log_uniform_values":
        return math.exp(rng.uniform(math.log(parameter["min"]), math.log(parameter["max"])))
    raise AssertionError(f"no sampler for sweep parameter {parameter}")


def agent_command(command: list[str], point: dict) -> list[str]:
    """The argv the W&B agent builds: macros replaced by its own argument formats (`${env}` dropped)."""
    formats = create_sweep_command_args({"args": {key: {"value": value} for key, value in point.items()}})
    argv = []
    for item in command:
        if item.startswith("${") and item.endswith("}"):
            argv += [] if item == "${env}" else formats[item[2:-1]]
        else:
            argv.append(item)
    return argv


def resolved_config(argv: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--print_config"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    return yaml.safe_load(captured.out)


def dotted_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= dotted_keys(value, f"{prefix}{key}.")
    return keys


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_a_tiny_and_a_paper_scale_sweep_exist():
    configs = {yaml.safe_load(p.read_text())["command"][4] for p in SWEEPS}
    assert {"configs/tiny/hass_mixed_wandb.yaml", "configs/hass_mixed_35k.yaml"} <= configs


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_sweep_is_well_formed_and_sweeps_real_config_keys(sweep, capsys):
    spec = yaml.safe_load(sweep.read_text())
    assert spec["method"] in ("bayes", "random") and spec["metric"] == {"name": "val/tau", "goal": "maximize"}
    command = spec["command"]
    assert command[1:4] == ["taps-train", "fit", "--config"] and "${args}" in command
    assert (ROOT / command[4]).is_file()
    fixed = [item for item in command[5:] if not item.startswith("${")]
    keys = dotted_keys(resolved_config(["fit", "--config", str(ROOT / command[4]), *fixed], capsys))
    assert set(spec["parameters"]) <= keys, set(spec["parameters"]) - keys
    for parameter in spec["parameters"].values():  # recipes named by a sweep exist
        for value in parameter.get("values", []):
            if isinstance(value, str) and value.startswith("data_recipes/"):
                assert (ROOT / value).is_file(), value


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_a_sampled_point_runs_through_the_cli(sweep, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the agent runs the command from the repository root
    spec = yaml.safe_load(sweep.read_text())
    point = {key: sample(parameter, random.Random(0)) for key, parameter in spec["parameters"].items()}
    argv = agent_command(spec["command"], point)
    assert argv[0] == "taps-train"
    resolved = resolved_config(argv[1:], capsys)
    for key, value in point.items():
        assert lookup(resolved, key) == pytest.approx(value) if isinstance(value, float) else lookup(resolved, key) == value
    logger = resolved["trainer"]["logger"]["init_args"]
    assert logger["name"] is None and logger["offline"] is False  # W&B names sweep trials, and sweeps run online


def test_swept_mixture_ratios_reuse_the_single_source_caches():
    """Same source, args, seed, held-out size and max length as tiny_math / tiny_chat, within their counts."""
    singles = {s.source: (s, r) for r in (load_recipe(ROOT / "data_recipes" / f"{n}.yaml") for n in ("tiny_math", "tiny_chat")) for s in r.sources}
    for name in ("tiny_mixed_math_heavy", "tiny_mixed_chat_heavy"):
        mixture = load_recipe(ROOT / "data_recipes" / f"{name}.yaml")
        assert sum(s.count for s in mixture.sources) == 2000
        for source in mixture.sources:
            single, recipe = singles[source.source]
            assert (source.args, source.heldout, mixture.seed, mixture.max_length) == (single.args, single.heldout, recipe.seed, recipe.max_length)
            assert source.count <= single.count
