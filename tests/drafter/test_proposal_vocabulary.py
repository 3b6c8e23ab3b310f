"""An EAGLE-1/2 drafter's proposal vocabulary: drafting reads only those rows of the LM head, training picks them
from its data and checkpoints keep them, averages take their union, exports leave them out (engines draft over the
whole vocabulary). Lossless decoding with one is tested beside the other drafters' (tests/decoding/test_spec.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from taps_train.decoding.draft import DrafterState
from taps_train.decoding.tree import TreeConfig
from taps_train.drafter.average import average_checkpoints
from taps_train.drafter.checkpoint import load_drafter
from taps_train.errors import TapsError
from taps_train.export import export_drafter, load_exported
from taps_train.training import Eagle2Module, HassModule
from tests.decoding.test_spec import PROMPTS, random_drafter
from tests.export.test_export import fingerprint, save_checkpoint  # noqa: F401 - fixture
from tests.training.test_training import data, recipe, trainer  # noqa: F401 - the recipe fixture


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


@torch.no_grad()
def test_proposals_are_the_whole_vocabularys_logits_at_those_tokens_and_drafts_use_no_other(verifier):
    proposal = [3, 8, 40, 41, 99, 250]
    drafter = random_drafter(verifier, seed=0, proposal=list(reversed(proposal)))  # kept ascending whatever the order given
    features = torch.randn(4, drafter.config.hidden_size)
    logits, ids = drafter.proposal_logits(features)
    assert ids.tolist() == proposal
    torch.testing.assert_close(logits, drafter.logits(features)[:, proposal])
    state = DrafterState(drafter)
    with torch.no_grad():
        hidden = verifier(torch.tensor([PROMPTS[0]]), output_hidden_states=True).hidden_states
    state.extend(tuple(h[0] for h in hidden), torch.tensor(PROMPTS[0][1:] + [5]))
    tree = state.draft(5, TreeConfig(total_tokens=12, depth=3, top_k=4))
    assert set(tree.tokens[1:].tolist()) <= set(proposal) and len(tree) == 12


@pytest.mark.parametrize("module_class", [Eagle2Module, HassModule])
def test_fit_proposes_its_datas_most_frequent_tokens_and_checkpoints_them(module_class, recipe, random_verifier_dir, tmp_path,  # noqa: F811
                                                                          fingerprint):  # noqa: F811
    module = module_class(verifier=str(random_verifier_dir), proposal_vocab_size=48)
    dm = data(recipe, random_verifier_dir)
    fit = trainer(tmp_path, max_steps=1)
    fit.fit(module, datamodule=dm)
    counts = dm.loss_token_counts(module.drafter.config.vocab_size)
    expected = torch.sort(-counts, stable=True).indices[:48].sort().values
    assert module.drafter.proposal_ids.tolist() == expected.tolist()
    fit.save_checkpoint(tmp_path / "run.ckpt")
    loaded = load_drafter(tmp_path / "run.ckpt", AutoModelForCausalLM.from_pretrained(random_verifier_dir), fingerprint)
    assert loaded.proposal_ids.tolist() == expected.tolist() and loaded.config.proposal_vocab_size == 48


def test_a_fraction_sizes_the_vocabulary_and_bad_sizes_are_one_line(random_verifier_dir):
    vocab = AutoModelForCausalLM.from_pretrained(random_verifier_dir).config.vocab_size
    module = Eagle2Module(verifier=str(random_verifier_dir), proposal_vocab_size=0.25)
    assert module.drafter.config.proposal_vocab_size == round(0.25 * vocab)
    assert Eagle2Module(verifier=str(random_verifier_dir)).drafter.proposal_ids is None
    for bad, message in [(0, "model.proposal_vocab_size must be an int >= 1"), (1.5, "or a float in \\(0, 1\\]"),
                         (True, "must be an int >= 1"), (vocab + 1, f"exceeds the verifier's vocabulary of {vocab} tokens")]:
        with pytest.raises(TapsError, match=message):
            Eagle2Module(verifier=str(random_verifier_dir), proposal_vocab_size=bad)


@pytest.mark.parametrize("second, expected", [([1, 2, 300], [1, 2, 7, 300]), (None, None)], ids=["both-restricted", "one-whole"])
def test_an_average_proposes_what_either_drafter_proposes(verifier, fingerprint, tmp_path, second, expected):  # noqa: F811
    first = save_checkpoint(random_drafter(verifier, 0, proposal=[1, 7, 300]), fingerprint, tmp_path / "a.ckpt")
    other = save_checkpoint(random_drafter(verifier, 1, proposal=second), fingerprint, tmp_path / "b.ckpt")
    averaged = average_checkpoints([first, other], [0.5, 0.5])
    ids = averaged["state_dict"].get("drafter.proposal_ids")
    assert (ids.tolist() if ids is not None else None) == expected
    assert averaged["taps"]["drafter_config"].get("proposal_vocab_size") == (len(expected) if expected else None)
    alone = average_checkpoints([first, other], [1.0, 0.0])  # a weight-0 drafter adds no tokens
    assert alone["state_dict"]["drafter.proposal_ids"].tolist() == [1, 7, 300]


@pytest.mark.parametrize("layout", ["eagle", "vllm"])
def test_exports_leave_the_proposal_vocabulary_out(verifier, fingerprint, random_verifier_dir, tmp_path, layout):  # noqa: F811
    drafter = random_drafter(verifier, 0, proposal=[1, 7, 300])
    checkpoint = save_checkpoint(drafter, fingerprint, tmp_path / "a.ckpt")
    out = tmp_path / layout
    export_drafter(checkpoint, out, verifier=str(random_verifier_dir), layout=layout, dtype="float32")
    assert "proposal_ids" not in load_file(out / "model.safetensors")
    assert "proposal_vocab_size" not in json.loads((out / "config.json").read_text())
    served = load_exported(out, verifier)
    assert served.proposal_ids is None  # engines propose from the whole vocabulary
    features = torch.randn(3, drafter.config.hidden_size)
    torch.testing.assert_close(served.logits(features), drafter.logits(features))
