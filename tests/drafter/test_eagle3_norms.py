"""EAGLE-3's norm variants (`norm_before_fc`, `norm_output`): training-time test is still drafting, decoding stays
lossless, exports carry them where the engine reads them (vLLM, speculators) and are refused where it does not
(SGLang), and a run is never resumed or warm-started into another variant."""

import json

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from taps_train.drafter import Eagle3Drafter, KVCache, build_drafter
from taps_train.errors import TapsError
from taps_train.export import export_drafter, load_exported
from taps_train.training import Eagle3Module
from tests.decoding.test_spec import PROMPTS, greedy_reference
from tests.export.test_export import fingerprint, save_checkpoint  # noqa: F401 - fixture
from tests.training.test_eagle3 import verifier_states
from tests.training.test_training import data, recipe, trainer  # noqa: F401 - fixture

VARIANTS = [{"norm_before_fc": True}, {"norm_output": True}, {"norm_before_fc": True, "norm_output": True}]


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def variant_drafter(verifier, seed: int, **norms: bool) -> Eagle3Drafter:
    """A random EAGLE-3 drafter of the variant, its norm gains not all ones (so a dropped norm shows)."""
    torch.manual_seed(seed)
    vocab = verifier.config.vocab_size
    drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, vocab // 2, **norms))
    drafter.load_verifier_parts(verifier)
    drafter.set_vocabulary(torch.randperm(vocab)[: vocab // 2])
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return drafter.eval()


def draft_chain(drafter: Eagle3Drafter, verifier, ids: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Logits of a greedy chain of `depth` draft steps after the committed `ids`: what an engine's chain drafts."""
    features = verifier_states(verifier, ids, drafter)[:-1]
    next_ids, length = ids[1:][None], len(ids) - 1
    cache, logits = KVCache(), []
    with torch.no_grad():
        state = drafter(next_ids, features[None], torch.arange(length)[None], torch.ones(length, length, dtype=torch.bool).tril(), cache)[:, -1:]
        for step in range(depth):
            logits.append(drafter.logits(state)[0, 0])
            token = logits[-1].argmax().view(1, 1)
            state = drafter(token, state, torch.tensor([[length + step]]), torch.ones(1, len(cache) + 1, dtype=torch.bool), cache)
    return logits


@pytest.mark.parametrize("norms", VARIANTS, ids=str)
def test_each_variant_drafts_differently_and_training_passes_are_its_draft_steps(verifier, norms):
    drafter, plain = variant_drafter(verifier, 0, **norms), variant_drafter(verifier, 0)
    ids = torch.tensor(PROMPTS[2])
    assert not torch.allclose(draft_chain(drafter, verifier, ids, 3)[-1], draft_chain(plain, verifier, ids, 3)[-1])
    features = verifier_states(verifier, ids, drafter)
    next_ids, inputs = ids[1:][None], features[:-1][None]
    passes = drafter.unroll(next_ids, inputs, steps=3)
    t = len(ids) - 5
    cache = KVCache()
    with torch.no_grad():
        state = drafter(next_ids[:, : t + 1], inputs[:, : t + 1], torch.arange(t + 1)[None], torch.ones(t + 1, t + 1, dtype=torch.bool).tril(), cache)[:, -1:]
        for k in range(1, 3):
            state = drafter(next_ids[:, t + k: t + k + 1], state, torch.tensor([[t + k]]), torch.ones(1, len(cache) + 1, dtype=torch.bool), cache)
            torch.testing.assert_close(state[0, 0], passes[k][0, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norms", VARIANTS, ids=str)
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_speculative_decoding_with_a_variant_equals_plain_greedy(verifier, norms, prompt):
    decoder = SpeculativeDecoder(verifier, [variant_drafter(verifier, len(prompt), **norms)], TreeConfig(total_tokens=8, depth=3, top_k=2),
                                 eos_token_ids=[])
    assert decoder.generate(prompt, max_new_tokens=30).tokens == greedy_reference(verifier, prompt, 30, [])


@pytest.mark.parametrize("layout", ["vllm", "speculators"])
def test_vllm_and_speculators_exports_carry_the_variant_and_read_back_drafting_the_same(verifier, fingerprint, random_verifier_dir,  # noqa: F811
                                                                                      tmp_path, layout):
    drafter = variant_drafter(verifier, 3, norm_before_fc=True, norm_output=True)
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir),
                         layout=layout, dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["norm_before_fc"] is True and config["norm_output"] is True  # where vLLM and speculators look
    assert load_file(out / "model.safetensors")["input_norm.weight"].shape == (3 * verifier.config.hidden_size,)
    loaded = load_exported(out, verifier)
    ids = torch.tensor(PROMPTS[1])
    for ours, theirs in zip(draft_chain(drafter, verifier, ids, 3), draft_chain(loaded, verifier, ids, 3)):
        torch.testing.assert_close(theirs, ours)


def test_sglang_export_of_a_variant_is_refused_naming_the_layouts_that_serve_it(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(variant_drafter(verifier, 4, norm_output=True), fingerprint, tmp_path / "d.ckpt")
    with pytest.raises(TapsError, match=r"trained with \['norm_output'\], which SGLang .* does not read.*use --format .*vllm"):
        export_drafter(checkpoint, tmp_path / "out", verifier=str(random_verifier_dir), layout="eagle")
    assert not (tmp_path / "out").exists()


def test_a_draft_from_elsewhere_flagging_norm_before_fc_in_eagle_config_reads_as_vllm_serves_it(verifier, fingerprint,  # noqa: F811
                                                                                              random_verifier_dir, tmp_path):
    """vLLM looks for norm_before_fc in eagle_config first; a draft that puts it only there has the norm."""
    drafter = variant_drafter(verifier, 5, norm_before_fc=True)
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir),
                         layout="vllm", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    del config["norm_before_fc"]
    config["eagle_config"]["norm_before_fc"] = True
    (out / "config.json").write_text(json.dumps(config))
    assert load_exported(out, verifier).input_norm is not None
    config["eagle_config"]["fc_norm"] = True
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(TapsError, match=r"sets \['fc_norm'\]; taps-train's EAGLE-3 drafter has no such variant"):
        load_exported(out, verifier)


def test_a_run_is_not_resumed_or_warm_started_into_another_variant(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, ttt_steps=2, norm_output=True)
    dm = data(recipe, random_verifier_dir, verifier_states=module.drafter.feature_contract().layers)
    trainer(tmp_path, max_steps=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(module, datamodule=dm)
    last = tmp_path / "ck" / "last.ckpt"
    with pytest.raises(TapsError, match="was trained with .*'norm_output': True.*set those model options as it was trained"):
        Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, init_from=str(last))
    other = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, ttt_steps=2)
    with pytest.raises(TapsError, match="was trained with .*'norm_output': True"):
        trainer(tmp_path / "o", max_steps=4).fit(other, datamodule=dm, ckpt_path=last)
    same = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, ttt_steps=2, norm_output=True, init_from=str(last))
    torch.testing.assert_close(same.drafter.fc.weight, module.drafter.fc.weight)


def test_drafters_of_different_variants_are_not_averaged(verifier, fingerprint, tmp_path):  # noqa: F811
    """norm_output adds no weight, so the shapes agree: only the flags tell the two networks apart."""
    from taps_train.drafter.average import average_checkpoints

    checkpoints = [save_checkpoint(variant_drafter(verifier, seed, **norms), fingerprint, tmp_path / f"{seed}.ckpt")
                   for seed, norms in ((6, {"norm_output": True}), (7, {}))]
    with pytest.raises(TapsError, match="'norm_output': True.*'norm_output': False.*compute differently"):
        average_checkpoints(checkpoints)
    same = [save_checkpoint(variant_drafter(verifier, seed, norm_output=True), fingerprint, tmp_path / f"same{seed}.ckpt") for seed in (8, 9)]
    assert average_checkpoints(same)["taps"]["drafter_config"]["norm_output"] is True
