"""W&B tracking: a tiny training run and an eval logged offline without any API key or network."""

import json
import socket
import struct
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import wandb
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from wandb.errors import UsageError
from wandb.proto import wandb_internal_pb2

from taps_train import tracking
from taps_train.cli import main
from taps_train.data.datamodule import DrafterDataModule
from taps_train.tracking import TapsWandbLogger, offline_reason, run_tags, start_run
from taps_train.training import Eagle2Module, HassModule

BLOCK = 32768  # the .wandb transaction log uses LevelDB's log format: 32 KiB blocks of CRC/length/type-framed chunks


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch) -> list[str]:
    """No API key anywhere, W&B's own files under tmp_path; returns the lines tracking announces."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    lines: list[str] = []
    monkeypatch.setattr(tracking, "rank_zero_info", lines.append)
    return lines


@pytest.fixture
def recipe(tmp_path) -> str:
    path = tmp_path / "tiny_test.yaml"
    path.write_text("name: tiny_test\nseed: 0\nmax_length: 256\nsources:\n"
                    "  - source: gsm_symbolic\n    args: {size: 40, seed: 3}\n    heldout: 4\n    count: 16\n")
    return str(path)


def offline_records(save_dir: Path, timeout: float = 30.0) -> list[wandb_internal_pb2.Record]:
    """Every record of the one offline run under save_dir/wandb, once W&B has written its last (exit) record:
    `finish()` returns before W&B's service process has flushed the log."""
    (log,) = save_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = parse_log(log.read_bytes())
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{log} has no exit record after {timeout} s"
        time.sleep(0.2)


def parse_log(data: bytes) -> list[wandb_internal_pb2.Record]:
    position, chunks, records = 7, [], []  # 7: the file header
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if position + 7 + length > len(data):  # still being written
            break
        chunks.append(data[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # full or last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def history_keys(records) -> set[str]:
    """Top-level keys of the logged history rows (tables are logged as nested references)."""
    return {item.key or item.nested_key[0] for r in records if r.WhichOneof("record_type") == "history" for item in r.history.item}


def test_tiny_run_without_api_key_logs_offline_with_metrics_and_tags(no_wandb_account, recipe, random_verifier_dir, tmp_path):
    logger = TapsWandbLogger(project="taps-test", name="tiny", save_dir=str(tmp_path / "run"), tags=["test"])
    trainer = Trainer(accelerator="cpu", max_steps=3, logger=logger, log_every_n_steps=1, val_check_interval=3, limit_val_batches=1,
                      num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      default_root_dir=tmp_path)
    trainer.fit(HassModule(verifier=str(random_verifier_dir)), datamodule=DrafterDataModule(recipe, verifier=str(random_verifier_dir), batch_size=4))
    logger.experiment.finish()

    assert len(no_wandb_account) == 1 and "W&B logging offline: no W&B API key" in no_wandb_account[0]
    assert str(tmp_path / "run" / "wandb" / "offline-run-") in no_wandb_account[0]
    records = offline_records(tmp_path / "run")
    keys = history_keys(records)
    assert {"train/loss", "train/feature_loss_step3", "train/topk_loss_step1", "train/acc_top1_step1", "val/loss", "trainer/global_step"} <= keys
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs[0].display_name == "tiny" and runs[0].project == "taps-test"
    assert {"test", "hass", "tiny_test"} <= set(runs[-1].tags)
    config = {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "config" for item in r.config.update}
    assert config["align_steps"] == 3 and config["recipe"].endswith("tiny_test.yaml")


def test_without_api_key_wandb_raises_but_start_run_goes_offline(no_wandb_account, tmp_path):
    with pytest.raises(UsageError):
        wandb.init(project="taps-test", dir=str(tmp_path))
    run = start_run(lambda mode: wandb.init(project="taps-test", dir=str(tmp_path), mode=mode))
    assert run.offline
    run.finish()
    assert "no W&B API key" in no_wandb_account[0]


def test_unreachable_server_with_a_key_means_offline(no_wandb_account, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the socket is: nothing listens there
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    assert offline_reason(None) == "127.0.0.1 is not reachable"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert offline_reason(None) is None
        assert offline_reason("offline") == "mode offline requested"
        monkeypatch.setenv("WANDB_MODE", "disabled")
        assert offline_reason(None) is None  # disabled stays disabled, not offline


def test_a_failed_online_start_retries_offline(no_wandb_account, monkeypatch, tmp_path):
    monkeypatch.setattr(tracking, "offline_reason", lambda mode: None)
    modes = []

    def init(mode):
        modes.append(mode)
        if mode != "offline":
            raise UsageError("invalid API key")
        return SimpleNamespace(dir=str(tmp_path / "wandb" / "offline-run-x" / "files"))

    start_run(init)
    assert modes == [None, "offline"]
    assert "online start failed: invalid API key" in no_wandb_account[0]


def test_backbone_tag_follows_the_objective_and_recipe_tag_the_file():
    assert run_tags({"align_steps": 3, "topk_weight": 1.0, "recipe": "data_recipes/tiny_mixed.yaml"}) == ["hass", "tiny_mixed"]
    assert run_tags({"align_steps": 1, "topk_weight": 0.0}) == ["eagle2"]
    assert run_tags({"align_steps": 1, "topk_weight": 1.0}) == ["hass"]
    assert run_tags({}) == []


def test_eval_logs_depth_table_and_report_artifact(no_wandb_account, recipe, random_verifier_dir, tmp_path):
    Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
            default_root_dir=tmp_path, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(
        Eagle2Module(verifier=str(random_verifier_dir)), datamodule=DrafterDataModule(recipe, verifier=str(random_verifier_dir), batch_size=4))
    checkpoint = str(tmp_path / "ck" / "last.ckpt")
    main(["eval", "--drafters", checkpoint, checkpoint, "--strategy", "average", "--weights", "0.7", "0.3",
          "--verifier", str(random_verifier_dir), "--benchmarks", "math_heldout", "--prompts", "1", "--max-new-tokens", "6",
          "--total-tokens", "8", "--depth", "2", "--top-k", "2", "--output", str(tmp_path / "eval" / "r.json"), "--wandb-project", "taps-test"])

    report = json.loads((tmp_path / "eval" / "r.json").read_text())
    assert report["weights"] == [0.7, 0.3]
    records = offline_records(tmp_path / "eval")
    assert {"eval/tau", "eval/accept_rate_by_depth", "eval/accept_rate_by_depth_plot_table"} <= history_keys(records)
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "eval-report"]
    assert [a.name for a in artifacts] == ["eval-report-average"]
    assert [entry.path for entry in artifacts[0].manifest.contents] == ["r.json"]
    (depth_table,) = (tmp_path / "eval").glob("wandb/offline-run-*/files/media/table/eval/accept_rate_by_depth_*.table.json")
    rows = json.loads(depth_table.read_text())["data"]
    assert [row[3] for row in rows] == list(range(1, len(report["benchmarks"]["math_heldout"]["accept_rate_by_depth"]) + 1))


@pytest.mark.parametrize("hparams, architecture", [({"align_steps": 3}, "LlamaForCausalLMEagle"), ({"topk_weight": 1.0}, "LlamaForCausalLMEagle"),
                                                   ({"align_steps": 1, "topk_weight": 0.0}, "LlamaForCausalLMEagle"),
                                                   ({"ttt_steps": 7, "draft_vocab_size": 32000}, "LlamaForCausalLMEagle3")])
def test_export_provenance_and_run_tags_name_the_same_backbone(hparams, architecture):
    from taps_train.export.drafter import training_method as _backbone

    source = SimpleNamespace(checkpoint={"hyper_parameters": hparams}, config=SimpleNamespace(fc_bias=False, architectures=[architecture]))
    assert [_backbone(source)["name"]] == run_tags(hparams)
