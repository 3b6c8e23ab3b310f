"""Every shipped LightningCLI YAML parses and validates, and its model/datamodule instantiate
(with the hub verifier swapped for a local random one: nothing is downloaded)."""

from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser

from taps_train.cli import main
from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import Eagle2Module, Eagle3Module, HassModule

ROOT = Path(__file__).resolve().parents[2]
FULL_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "model" in yaml.safe_load(p.read_text()))
# configs/sweeps/ holds W&B sweep definitions, not LightningCLI configs (tests/shipped/test_sweeps.py checks them).
OVERRIDES = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p not in FULL_CONFIGS and p.parent.name not in ("sweeps", "study"))
STUDIES = sorted((ROOT / "configs" / "study").glob("*.yaml"))
MODULES = {"taps_train.training.HassModule": HassModule, "taps_train.training.Eagle2Module": Eagle2Module,
           "taps_train.training.Eagle3Module": Eagle3Module}


def test_configs_exist():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in FULL_CONFIGS}
    assert "hass_mixed_35k.yaml" in names and "tiny/hass_mixed.yaml" in names and "tiny/eagle2_mixed.yaml" in names
    assert {"eagle3_mixed_35k.yaml", "tiny/eagle3_math.yaml", "tiny/eagle3_chat.yaml", "tiny/eagle3_mixed.yaml"} <= names
    # 17 paper-scale (4 recipes x EAGLE-2, HASS, HASS stage 1, HASS stage 2; EAGLE-3 on mixed_35k) + 11 tiny
    # (EAGLE-2, HASS and EAGLE-3 x math, chat, mixed; a larger mixed HASS; one logging to W&B) + 11 for SmolLM2 (the 9
    # backbone x recipe fits, the chat ablation on SmolLM2's own replies and the README's main job)
    assert {f"smol/{b}_{d}.yaml" for b in ("eagle2", "hass", "eagle3") for d in ("math", "chat", "mixed")} <= names
    assert {"smol/eagle2_chat_regen.yaml", "smol/eagle2_math_quick.yaml"} <= names and len(names) == 39


def print_config(capsys, *configs: Path) -> dict:
    args = ["fit"] + [arg for config in configs for arg in ("--config", str(config))] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    # DeepSpeed logs "[<time>] [WARNING] ..." to stdout the first time a config in this process names its strategy.
    return yaml.safe_load("\n".join(line for line in captured.out.splitlines() if not line.startswith("[")))


@pytest.mark.parametrize("config", FULL_CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_validates_with_lightning_cli(config, capsys):
    resolved = print_config(capsys, config)
    assert resolved["model"]["init_args"]["verifier"]
    assert "verifier" not in resolved["data"]["init_args"]  # linked from model.init_args.verifier


@pytest.mark.parametrize("override", OVERRIDES, ids=lambda p: p.name)
def test_override_configs_validate_on_top_of_a_paper_config(override, capsys):
    resolved = print_config(capsys, ROOT / "configs" / "hass_mixed_35k.yaml", override)
    assert f"zero{resolved['trainer']['strategy']['init_args']['stage']}" in override.name
    assert resolved["trainer"]["gradient_clip_algorithm"] == "norm"  # DeepSpeed cannot clip values


@pytest.mark.parametrize("config", FULL_CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_model_and_data_instantiate(config, random_verifier_dir):
    raw = yaml.safe_load(config.read_text())
    model_args = {**raw["model"].get("init_args", {}), "verifier": str(random_verifier_dir)}
    model_args.pop("init_from", None)  # HASS stage 2 warm-starts from a stage-1 run that does not exist here
    model_args.pop("feature_layers", None)  # Llama-3-8B's layers; the random verifier has two
    if isinstance(model_args.get("draft_vocab_size"), int):  # 32,000 of Llama-3's 128k tokens; the random verifier has 400
        model_args["draft_vocab_size"] = 0.25
    module = MODULES[raw["model"]["class_path"]](**model_args)
    assert module.drafter.config.hidden_size == 32
    data_args = {**raw["data"]["init_args"], "verifier": str(random_verifier_dir)}
    data_args["recipe"] = str(ROOT / data_args["recipe"])
    assert DrafterDataModule(**data_args).recipe.sources


@pytest.mark.parametrize("stage2", sorted((ROOT / "configs").glob("hass_*_stage2.yaml")), ids=lambda p: p.name)
def test_hass_stage2_warm_starts_from_its_stage1_run(stage2):
    """HASS's reference recipe: stage 1 without top-K distillation, stage 2 with it at a lower rate from
    stage 1's final weights (the `last.ckpt` its periodic checkpoint writes at the end of training)."""
    stage1 = stage2.with_name(stage2.name.replace("stage2", "stage1"))
    first, second = (yaml.safe_load(p.read_text()) for p in (stage1, stage2))
    last_ckpt_dirs = [c["init_args"]["dirpath"] for c in first["trainer"]["callbacks"] if c["init_args"].get("save_last")]
    assert second["model"]["init_args"]["init_from"] == f"{last_ckpt_dirs[0]}/last.ckpt"
    assert first["model"]["init_args"]["topk_weight"] == 0 and second["model"]["init_args"]["topk_weight"] == 1
    assert second["model"]["init_args"]["lr"] < first["model"]["init_args"]["lr"]
    assert first["data"] == second["data"] and first["trainer"]["default_root_dir"] != second["trainer"]["default_root_dir"]


def test_unknown_key_and_wrong_type_are_rejected(tmp_path, capsys):
    config = yaml.safe_load((ROOT / "configs" / "tiny" / "hass_mixed.yaml").read_text())
    config["model"]["init_args"]["learning_rate"] = 1e-3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(bad), "--print_config"])
    assert exit_info.value.code != 0 and "learning_rate" in capsys.readouterr().err

    config["model"]["init_args"].pop("learning_rate")
    config["data"]["init_args"]["batch_size"] = "eight"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(bad), "--print_config"])
    assert exit_info.value.code != 0 and "batch_size" in capsys.readouterr().err


def test_jsonargparse_sees_every_module_argument():
    """Configs map one-to-one to constructor arguments, including HassModule's forwarded ones."""
    parser = ArgumentParser()
    parser.add_class_arguments(HassModule, "model")
    keys = {action.dest for action in parser._actions}
    assert {"model.align_steps", "model.topk_weight", "model.lr", "model.verifier", "model.init_from"} <= keys
    parser = ArgumentParser()
    parser.add_class_arguments(Eagle3Module, "model")
    keys = {action.dest for action in parser._actions}
    assert {"model.draft_vocab_size", "model.ttt_steps", "model.feature_layers", "model.lr", "model.verifier"} <= keys
    assert not keys & {"model.align_steps", "model.feature_weight", "model.seed"}  # EAGLE-2 options are not EAGLE-3's


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_study_config_parses_checks_and_plans(study, monkeypatch, capsys):
    """Every study file names existing recipes and fit configs, known strategies, and plans its cells (--dry-run)."""
    monkeypatch.chdir(ROOT)
    main(["study", "--config", str(study), "--dry-run"])
    plan = capsys.readouterr().err
    assert f"study {study.stem} ->" in plan and "cells done" in plan and " fit " in plan
