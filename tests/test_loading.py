import json
import shutil

import pytest

from taps_train.errors import TapsError
from taps_train.verifier import load_verifier


def test_local_directory_loads_frozen_in_eval_mode(random_verifier_dir):
    loaded = load_verifier(str(random_verifier_dir))
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)


def test_bfloat16_dtype(random_verifier_dir):
    loaded = load_verifier(str(random_verifier_dir), dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype.is_floating_point and str(loaded.model.dtype) == "torch.bfloat16"


def test_missing_path_names_the_path(tmp_path):
    with pytest.raises(TapsError, match=f"verifier path {tmp_path}/nope does not exist"):
        load_verifier(str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(TapsError, match="has no config.json"):
        load_verifier(str(tmp_path))


def test_non_causal_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(TapsError, match="'vit' model without a causal-LM head"):
        load_verifier(str(tmp_path))


def test_missing_weight_file(random_verifier_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(random_verifier_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(TapsError, match=f"cannot load verifier weights/tokenizer from {broken}"):
        load_verifier(str(broken))


def test_unknown_dtype(random_verifier_dir):
    with pytest.raises(TapsError, match="unknown verifier dtype"):
        load_verifier(str(random_verifier_dir), dtype="int3")
