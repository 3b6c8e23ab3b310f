"""A fifth export layout is one new module: a toy layout, registered here alone, is listed by `taps-train export`,
exports, and reads back to the same drafter."""

import json

import pytest
import torch

from taps_train.cli import main
from taps_train.export import LAYOUTS, Layout, export_drafter, load_exported
from tests.export.test_export import drafter_logits, fingerprint, make_drafter, random_inputs, save_checkpoint, verifier  # noqa: F401 (fixtures)


class ToyLayout(Layout):
    """An engine that wants every tensor under `draft.` and the Llama config nested under `llama`."""

    name = "toy"
    engine = "a toy engine (draft.* tensors, nested config)"

    def architecture(self, backbone):
        return f"Toy{backbone.architecture}"

    def recognizes(self, config):
        return "llama" in config

    def files(self, config, tensors, drafter, verifier, verifier_architectures, dtype):
        return {"llama": config, "verifier": verifier}, {f"draft.{key}": value for key, value in tensors.items()}

    def read(self, config, tensors, verifier_layers, where):
        return config["llama"], {key.removeprefix("draft."): value for key, value in tensors.items()}


@pytest.fixture
def toy_layout(monkeypatch):
    monkeypatch.setitem(LAYOUTS, "toy", ToyLayout())


@pytest.mark.parametrize("fc_bias", [False, True], ids=["eagle2", "hass"])
def test_a_toy_layout_exports_reads_back_and_is_listed(toy_layout, verifier, fingerprint, random_verifier_dir, tmp_path, capsys, fc_bias):
    drafter = make_drafter(verifier, 5, fc_bias)
    checkpoint = save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt")
    main(["export", str(checkpoint), "--out", str(tmp_path / "out"), "--format", "toy", "--verifier", str(random_verifier_dir),
          "--dtype", "float32"])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["llama"]["architectures"] == ["ToyLlamaForCausalLMEagle"]
    assert json.loads((tmp_path / "out" / "taps_export.json").read_text())["format"] == "toy"
    ids, features = random_inputs(drafter)
    assert torch.equal(drafter_logits(load_exported(tmp_path / "out", verifier), ids, features), drafter_logits(drafter, ids, features))

    (tmp_path / "out" / "taps_export.json").unlink()  # a toy draft from elsewhere: recognized by its config
    assert torch.equal(drafter_logits(load_exported(tmp_path / "out", verifier), ids, features), drafter_logits(drafter, ids, features))

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "toy: a toy engine" in " ".join(capsys.readouterr().out.split())
