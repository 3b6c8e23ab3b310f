"""User errors in `fit`/`validate` (constructor arguments, `init_from`, `--ckpt_path`) print one
`taps-train: error:` line naming the bad file or value, not jsonargparse's multi-page ValueError or
Lightning's traceback; anything else keeps its traceback."""

from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.commands.errors import wrapped_taps_error
from taps_train.errors import TapsError

RECIPE = (
    "name: tiny_test\nseed: 0\nmax_length: 256\nsources:\n"
    "  - source: gsm_symbolic\n    args: {size: 80, seed: 3}\n    heldout: 8\n    count: 48\n"
)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # Lightning writes config.yaml / logs under the working directory
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "garbage.ckpt").write_bytes(b"\x80\x04\x95garbage bytes, not a checkpoint\xff\x00" * 8)
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("these are my notes, not a checkpoint\n")
    (tmp_path / "not_deepspeed.ckpt").mkdir()
    return tmp_path


def fit_args(verifier: Path, tmp: Path, command: str = "fit", **overrides: str) -> list[str]:
    options = {
        "--seed_everything": "false",  # else Lightning's own "INFO: Seed set to 0" precedes the error line
        "--trainer.accelerator": "cpu",
        "--trainer.logger": "false",
        "--trainer.enable_progress_bar": "false",
        "--trainer.enable_model_summary": "false",
        "--trainer.enable_checkpointing": "false",
        "--trainer.max_steps": "1",
        "--trainer.default_root_dir": str(tmp / "run"),
        "--model": "taps_train.training.Eagle2Module",
        "--model.verifier": str(verifier),
        "--data": "taps_train.data.datamodule.DrafterDataModule",
        "--data.recipe": str(tmp / "recipe.yaml"),
        "--data.batch_size": "4",
        **overrides,
    }
    return [command, *(item for pair in options.items() for item in pair)]


# (command, overrides with {tmp} for the test's directory, text the one error line must contain)
CASES = {
    "bad_schedule": ("fit", {"--model.schedule": "exponential"}, "unknown model.schedule 'exponential'"),
    "unknown_verifier_path": ("fit", {"--model.verifier": "{tmp}/no_such_verifier"}, "{tmp}/no_such_verifier"),
    "missing_recipe": ("fit", {"--data.recipe": "{tmp}/no_such_recipe.yaml"}, "{tmp}/no_such_recipe.yaml"),
    "bad_feature_dtype": ("fit", {"--data.feature_dtype": "float8"}, "'float8'"),
    "init_from_missing": ("fit", {"--model.init_from": "{tmp}/missing.ckpt"}, "{tmp}/missing.ckpt"),
    "init_from_garbage": ("fit", {"--model.init_from": "{tmp}/garbage.ckpt"}, "{tmp}/garbage.ckpt"),
    "init_from_dir_without_latest": ("fit", {"--model.init_from": "{tmp}/not_deepspeed.ckpt"}, "{tmp}/not_deepspeed.ckpt"),
    "validate_init_from_garbage": ("validate", {"--model.init_from": "{tmp}/garbage.ckpt"}, "{tmp}/garbage.ckpt"),
    "ckpt_path_missing": ("fit", {"--ckpt_path": "{tmp}/missing.ckpt"}, "{tmp}/missing.ckpt"),
    "ckpt_path_empty": ("fit", {"--ckpt_path": "{tmp}/empty.ckpt"}, "{tmp}/empty.ckpt"),
    "ckpt_path_garbage": ("fit", {"--ckpt_path": "{tmp}/garbage.ckpt"}, "{tmp}/garbage.ckpt"),
    "ckpt_path_text_file": ("fit", {"--ckpt_path": "{tmp}/notes.txt"}, "{tmp}/notes.txt"),
    "ckpt_path_dir_without_latest": ("fit", {"--ckpt_path": "{tmp}/not_deepspeed.ckpt"}, "{tmp}/not_deepspeed.ckpt"),
    "validate_ckpt_path_garbage": ("validate", {"--ckpt_path": "{tmp}/garbage.ckpt"}, "{tmp}/garbage.ckpt"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line(case, random_verifier_dir, workdir, capsys):
    command, overrides, expected = CASES[case]
    overrides = {key: value.format(tmp=workdir) for key, value in overrides.items()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(fit_args(random_verifier_dir, workdir, command, **overrides))
    assert exit_info.value.code not in (0, None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("taps-train: error: ")
    assert expected.format(tmp=workdir) in lines[0]
    assert not (workdir / "run").exists() or not any((workdir / "run").rglob("*.ckpt"))


def test_genuine_bugs_keep_their_traceback():
    try:
        try:
            raise TapsError("user error")
        except TapsError:
            raise KeyError("a bug while handling it")
    except KeyError as bug:
        assert wrapped_taps_error(bug) is None
    try:
        try:
            raise TapsError("unknown schedule 'x'")
        except TapsError as err:
            raise ValueError("Does not validate against any of the Union subtypes\n...") from err
    except ValueError as wrapped:
        assert str(wrapped_taps_error(wrapped)) == "unknown schedule 'x'"
    assert wrapped_taps_error(ValueError("plain")) is None


def test_a_value_jsonargparse_rejects_is_one_line_naming_the_key(random_verifier_dir, workdir, capsys):
    # jsonargparse's check stays; its multi-page usage dump becomes one line that starts with where and which key
    with pytest.raises(SystemExit) as exit_info:
        main(fit_args(random_verifier_dir, workdir, **{"--model.lr": "not-a-number"}))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("taps-train: error: taps-train fit options: Parser key \"model\"") and "not-a-number" in err


def test_a_real_checkpoint_and_lightning_keywords_pass_the_ckpt_path_check(random_verifier_dir, workdir):
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from taps_train.commands.lightning import check_ckpt_path
    from taps_train.data.datamodule import DrafterDataModule
    from taps_train.training import Eagle2Module

    for keyword in ("last", "best", "hpc", None):
        check_ckpt_path(keyword)
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=workdir,
                      callbacks=[ModelCheckpoint(dirpath=workdir / "ck", save_last=True)])
    trainer.fit(Eagle2Module(verifier=str(random_verifier_dir)),
                datamodule=DrafterDataModule(str(workdir / "recipe.yaml"), verifier=str(random_verifier_dir), batch_size=4))
    check_ckpt_path(str(workdir / "ck" / "last.ckpt"))
