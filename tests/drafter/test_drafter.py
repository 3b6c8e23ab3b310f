import torch
from transformers import AutoConfig, AutoModelForCausalLM

from taps_train.drafter import Drafter, KVCache, drafter_config


def make_drafter(random_verifier_dir, fc_bias=False):
    verifier = AutoModelForCausalLM.from_pretrained(random_verifier_dir)
    drafter = Drafter(drafter_config(verifier.config, fc_bias))
    drafter.load_verifier_parts(verifier)
    return drafter, verifier


def causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def test_config_follows_the_verifier(random_verifier_dir):
    verifier_config = AutoConfig.from_pretrained(random_verifier_dir)
    config = drafter_config(verifier_config, fc_bias=True)
    assert config.num_hidden_layers == 1 and config.fc_bias
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        verifier_config.hidden_size, verifier_config.num_attention_heads, verifier_config.num_key_value_heads, verifier_config.vocab_size)


def test_embedding_and_head_are_the_verifiers_and_frozen(random_verifier_dir):
    drafter, verifier = make_drafter(random_verifier_dir)
    assert torch.equal(drafter.embed_tokens.weight, verifier.get_input_embeddings().weight)
    assert torch.equal(drafter.lm_head.weight, verifier.get_output_embeddings().weight)
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert trainable.isdisjoint(drafter.frozen_parameter_names()) and "fc.weight" in trainable
    assert drafter.fc.bias is None


def test_kv_cache_steps_equal_one_full_pass(random_verifier_dir):
    drafter, _ = make_drafter(random_verifier_dir)
    torch.manual_seed(0)
    ids, features = torch.randint(0, 100, (2, 7)), torch.randn(2, 7, drafter.config.hidden_size)
    positions = torch.arange(7)[None].expand(2, -1)
    full = drafter(ids, features, positions, causal(7))
    cache = KVCache()
    first = drafter(ids[:, :5], features[:, :5], positions[:, :5], causal(7)[:5, :5], cache)
    rest = drafter(ids[:, 5:], features[:, 5:], positions[:, 5:], causal(7)[5:, :7], cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 7


def test_tree_mask_isolates_branches(random_verifier_dir):
    """Two children of one prefix, run together under a tree mask, equal each path run alone."""
    drafter, _ = make_drafter(random_verifier_dir)
    torch.manual_seed(1)
    hidden = drafter.config.hidden_size
    prefix_ids, prefix_f = torch.randint(0, 100, (1, 4)), torch.randn(1, 4, hidden)
    child_ids, child_f = torch.randint(0, 100, (1, 2)), torch.randn(1, 2, hidden)
    cache = KVCache()
    drafter(prefix_ids, prefix_f, torch.arange(4)[None], causal(4), cache)
    tree_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]], dtype=torch.bool)  # siblings don't see each other
    both = drafter(child_ids, child_f, torch.tensor([[4, 4]]), tree_mask, cache)
    for i in range(2):
        path_ids = torch.cat([prefix_ids, child_ids[:, i : i + 1]], 1)
        path_f = torch.cat([prefix_f, child_f[:, i : i + 1]], 1)
        alone = drafter(path_ids, path_f, torch.arange(5)[None], causal(5))[:, -1]
        torch.testing.assert_close(both[:, i], alone, atol=1e-5, rtol=1e-5)
