"""EAGLE-3: training-time test matches drafting, decoding is lossless alone and composed with an
EAGLE-2/HASS drafter, the module trains and its checkpoints read back."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from taps_train.drafter import Eagle3Drafter, KVCache, build_drafter
from taps_train.drafter.checkpoint import load_drafter, read_checkpoint
from taps_train.features import FEATURES
from taps_train.decoding.accept import verifier_distribution
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.strategies import STRATEGIES
from taps_train.decoding.tree import TreeConfig
from taps_train.training import Eagle3Module
from taps_train.verifier.fingerprint import verifier_fingerprint
from tests.decoding.test_spec import PROMPTS, assert_same_distribution, greedy_reference, random_drafter, tiny_vocab_verifier
from tests.training.test_training import data, recipe, trainer  # noqa: F401 - the recipe fixture

MULTI = [name for name in STRATEGIES if name != "single"]


def random_eagle3(verifier, seed: int, draft_vocab: int | None = None, layers: tuple[int, ...] | None = None) -> Eagle3Drafter:
    torch.manual_seed(seed)
    vocab = verifier.config.vocab_size
    drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, draft_vocab or vocab // 2, layers))
    drafter.load_verifier_parts(verifier)
    drafter.set_vocabulary(torch.randperm(vocab)[: drafter.config.draft_vocab_size])
    return drafter.eval()


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def verifier_states(verifier, ids: torch.Tensor, drafter: Eagle3Drafter) -> torch.Tensor:
    with torch.no_grad():
        out = verifier(input_ids=ids[None], output_hidden_states=True)
    return drafter.feature_contract().extract(out.hidden_states)[FEATURES][0]


@torch.no_grad()
def test_training_pass_k_is_drafting_k_levels_deep(verifier):
    """Pass k of the unroll at index t equals the drafter run step by step as a draft does: commit indices <= t
    with verifier features, then feed its own state and the next true token k times."""
    drafter = random_eagle3(verifier, seed=0)
    ids = torch.tensor(PROMPTS[2])
    features = verifier_states(verifier, ids, drafter)
    next_ids, inputs = ids[1:][None], features[:-1][None]
    passes = drafter.unroll(next_ids, inputs, steps=4)
    length = next_ids.shape[1]
    for t in range(length - 4):
        cache = KVCache()
        positions = torch.arange(t + 1)[None]
        state = drafter(next_ids[:, : t + 1], inputs[:, : t + 1], positions, torch.ones(t + 1, t + 1, dtype=torch.bool).tril(), cache)[:, -1:]
        torch.testing.assert_close(state[0, 0], passes[0][0, t])
        for k in range(1, 4):
            token = next_ids[:, t + k : t + k + 1]
            state = drafter(token, state, torch.tensor([[t + k]]), torch.ones(1, len(cache) + 1, dtype=torch.bool), cache)
            torch.testing.assert_close(state[0, 0], passes[k][0, t], atol=1e-5, rtol=1e-5)


def test_logits_are_minus_infinity_outside_the_draft_vocabulary(verifier):
    drafter = random_eagle3(verifier, seed=1, draft_vocab=37)
    logits = drafter.logits(torch.randn(3, verifier.config.hidden_size))
    inside = drafter.t2d
    assert inside.sum() == 37 and torch.isfinite(logits[:, inside]).all() and torch.isneginf(logits[:, ~inside]).all()
    assert torch.equal(drafter.draft_token_ids, inside.nonzero().flatten())  # ascending, and d2t maps draft -> verifier ids


def test_drafting_proposes_only_draft_vocabulary_tokens_scored_as_over_the_full_vocabulary(verifier):
    """Drafting ranks the draft vocabulary's logits directly (no full-vocabulary copy), with the probabilities and
    entropies the full-vocabulary logits give; a top_k above the draft vocabulary proposes each of its tokens once."""
    drafter = random_eagle3(verifier, seed=2, draft_vocab=5)
    state = DrafterState(drafter)
    hidden = {i: torch.randn(6, verifier.config.hidden_size) for i in drafter.feature_contract().hidden_state_indices}
    state.extend(hidden, torch.tensor([3, 9, 4, 1, 5, 9]))
    tree = state.draft(7, TreeConfig(total_tokens=40, depth=2, top_k=8))
    allowed = set(drafter.draft_token_ids.tolist())
    assert set(tree.tokens[1:].tolist()) <= allowed
    root_children = tree.children(0)
    assert sorted(tree.tokens[root_children].tolist()) == sorted(allowed)
    full = torch.softmax(drafter.logits(state.root_feature[None]).float(), dim=-1)[0]
    torch.testing.assert_close(tree.probs[root_children], full[tree.tokens[root_children]])
    entropy = -(full[full > 0] * full[full > 0].log()).sum()
    torch.testing.assert_close(tree.entropy[root_children[0]], entropy)


@pytest.mark.parametrize("tree", [TreeConfig(), TreeConfig(total_tokens=8, depth=2, top_k=3)])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_plain_greedy(verifier, tree, prompt):
    decoder = SpeculativeDecoder(verifier, [random_eagle3(verifier, seed=len(prompt))], tree, eos_token_ids=[])
    result = decoder.generate(prompt, max_new_tokens=40)
    assert result.tokens == greedy_reference(verifier, prompt, 40, [])


@pytest.mark.parametrize("strategy", MULTI)
def test_an_eagle3_and_an_eagle2_drafter_compose_losslessly(verifier, strategy):
    drafters = [random_drafter(verifier, seed=4), random_eagle3(verifier, seed=5)]
    for prompt in PROMPTS[:2]:
        result = SpeculativeDecoder(verifier, drafters, TreeConfig(total_tokens=12, depth=3, top_k=3), STRATEGIES[strategy],
                                    eos_token_ids=[]).generate(prompt, max_new_tokens=30)
        assert result.tokens == greedy_reference(verifier, prompt, 30, [])


@pytest.mark.parametrize("strategy", ["single", "merge"])
def test_sampled_output_matches_the_verifier_distribution(strategy):
    """A draft vocabulary of 4 of the 6 tokens: the verifier's distribution is still emitted exactly."""
    verifier = tiny_vocab_verifier(seed=3)
    # One decoder layer: no state an engine captures, so no default; any state keeps decoding lossless.
    drafters = [random_eagle3(verifier, seed=6, draft_vocab=4, layers=(0, 1, 1))] + ([random_drafter(verifier, seed=7)] if strategy == "merge" else [])
    prompt, vocab = [2, 4, 1], verifier.config.vocab_size
    with torch.no_grad():
        first = verifier_distribution(verifier(torch.tensor([prompt])).logits[0, -1], 1.0)
        joint = torch.stack([first[a] * verifier_distribution(verifier(torch.tensor([prompt + [a]])).logits[0, -1], 1.0) for a in range(vocab)])
    decoder = SpeculativeDecoder(verifier, drafters, TreeConfig(total_tokens=8, depth=2, top_k=3), STRATEGIES[strategy],
                                 temperature=1.0, eos_token_ids=[])
    counts = torch.zeros(vocab * vocab)
    for seed in range(1500):
        tokens = decoder.generate(prompt, max_new_tokens=3, seed=seed).tokens
        counts[tokens[0] * vocab + tokens[1]] += 1
    assert_same_distribution(counts, joint.flatten())


def test_module_trains_chooses_its_vocabulary_and_its_checkpoint_decodes(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, ttt_steps=3, lr=3e-3)
    dm = data(recipe, random_verifier_dir, verifier_states=module.drafter.feature_contract().layers)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    trained = trainer(tmp_path, max_steps=30)
    trained.fit(module, datamodule=dm)
    counts = dm.loss_token_counts(module.drafter.config.vocab_size)
    chosen = module.drafter.draft_token_ids
    assert counts[chosen].min() >= counts[~module.drafter.t2d].max()  # the most frequent assistant tokens
    _, logs = module.step_losses(batch, train=False)
    assert set(logs) >= {"loss", "loss_step0", "loss_step2", "acc_step0"} and torch.isfinite(logs["loss"])
    path = tmp_path / "eagle3.ckpt"
    trained.save_checkpoint(path)
    checkpoint = read_checkpoint(path)
    assert torch.equal(checkpoint["state_dict"]["drafter.d2t"], module.drafter.d2t) and "drafter.embed_tokens.weight" not in checkpoint["state_dict"]
    verifier = AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()
    drafter = load_drafter(path, verifier, verifier_fingerprint(random_verifier_dir, dm._preparer().tokenizer))
    assert torch.equal(drafter.t2d, module.drafter.t2d)
    result = SpeculativeDecoder(verifier, [drafter], TreeConfig(), eos_token_ids=[]).generate(PROMPTS[0], max_new_tokens=30)
    assert result.tokens == greedy_reference(verifier, PROMPTS[0], 30, [])


def test_a_datamodule_built_for_another_contract_is_refused(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    from taps_train.errors import TapsError

    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64)
    with pytest.raises(TapsError, match=r"datamodule provides verifier hidden states \[-1\] but the drafter reads \[1, 1, 1\]"):
        trainer(tmp_path, max_steps=1).fit(module, datamodule=data(recipe, random_verifier_dir))


def test_online_features_equal_cached_ones(recipe, random_verifier_dir):  # noqa: F811
    """Online mode computes the same three fused states and targets the cache stores (to bf16 precision)."""
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64)
    layers = module.drafter.feature_contract().layers
    cached, online = (data(recipe, random_verifier_dir, verifier_states=layers, online=mode) for mode in (False, True))
    for dm in (cached, online):
        dm.prepare_data()
        dm.setup("fit")
    batch = next(iter(cached.train_dataloader()))
    online_batch = next(iter(online.train_dataloader()))
    assert torch.equal(batch["input_ids"], online_batch["input_ids"])
    from_cache, computed = module.batch_features(batch), module.batch_features(online_batch)
    mask = batch["attention_mask"]
    for name in ("features", "targets"):
        torch.testing.assert_close(from_cache[name][mask], computed[name][mask], rtol=2**-7, atol=1e-5)


def test_without_a_datamodule_the_vocabulary_must_be_given(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    from taps_train.errors import TapsError

    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, ttt_steps=2)
    dm = data(recipe, random_verifier_dir, verifier_states=module.drafter.feature_contract().layers)
    dm.prepare_data()
    dm.setup("fit")
    batches = [next(iter(dm.train_dataloader()))]
    with pytest.raises(TapsError, match="chooses its drafter.s vocabulary from the training data"):
        trainer(tmp_path, max_steps=1).fit(module, train_dataloaders=batches)
    module.choose_vocabulary(dm.loss_token_counts(module.drafter.config.vocab_size))
    chosen = module.drafter.d2t.clone()
    trainer(tmp_path, max_steps=1).fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    assert torch.equal(module.drafter.d2t, chosen)  # kept, not chosen again
