"""The decoder's per-round state is written in place: KV caches that grow by doubling and compact to the accepted
path, a tree mask whose prefix part is never rebuilt, and tree queries (children, ancestors) from one sort. Each is
checked against the plain construction it replaces, and the decoder against plain greedy decoding over many rounds."""

import torch
from transformers import AutoModelForCausalLM

from taps_train.drafter import KVCache
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import DraftTree, TreeConfig
from taps_train.decoding.verify import OpenPrefixMask, VerifierSession
from tests.decoding.test_spec import greedy_reference, random_drafter


def test_kv_cache_appends_crops_and_keeps_like_concatenation():
    torch.manual_seed(0)
    cache, reference = KVCache(), torch.empty(1, 2, 0, 4)
    for length in (3, 70, 1, 130):  # crosses the first capacity (64) and a doubling
        block = torch.randn(1, 2, length, 4)
        cache.append(block, -block)
        reference = torch.cat([reference, block], dim=2)
        assert torch.equal(cache.keys, reference) and torch.equal(cache.values, -reference) and len(cache) == reference.shape[2]
    storage = cache.keys.data_ptr()
    cache.crop(150)
    reference = reference[:, :, :150]
    kept = torch.tensor([0, 2, 5])
    cache.keep(140, kept.tolist())
    reference = torch.cat([reference[:, :, :140], reference[:, :, 140 + kept]], dim=2)
    assert torch.equal(cache.keys, reference) and torch.equal(cache.values, -reference)
    cache.append(torch.ones(1, 2, 4, 4), torch.ones(1, 2, 4, 4))
    assert cache.keys.data_ptr() == storage and len(cache) == 147  # written in place: no copy of the context


def test_open_prefix_mask_writes_only_the_tree_block_and_clears_it():
    mask = OpenPrefixMask(torch.float32, torch.device("cpu"))
    tree_mask = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
    for prefix in (5, 300, 6):  # the second grows the buffer past its first size
        written = mask.write(tree_mask, prefix)
        assert written.shape == (1, 1, 3, prefix + 3)
        assert torch.equal(written[0, 0, :, :prefix], torch.zeros(3, prefix))
        assert torch.equal(written[0, 0, :, prefix:] == 0, tree_mask)
        mask.clear()
        assert torch.count_nonzero(mask.buffer) == 0
    for n in range(1, 61):  # trees of every size at one prefix (as calibration times them): no side grows needlessly
        mask.write(torch.ones(n, n, dtype=torch.bool).tril(), 300)
        mask.clear()
    assert mask.buffer.shape == (96, 512)  # rows 3 -> 6 -> ... -> 96; columns 256 -> 512 (prefix 300), never more


def random_tree(seed: int, size: int = 40) -> DraftTree:
    generator = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, node, (), generator=generator)) for node in range(1, size)])
    depths = torch.zeros(size, dtype=torch.long)
    for node in range(1, size):
        depths[node] = depths[parents[node]] + 1
    probs = torch.rand(size, generator=generator).round(decimals=1)  # ties among siblings: the stable order decides
    return DraftTree(torch.arange(size), parents, depths, probs, probs.clone(), torch.zeros(size))


def test_children_and_ancestors_equal_their_node_by_node_definitions():
    for seed in range(5):
        tree = random_tree(seed)
        for node in range(len(tree)):
            kids = [child for child in range(len(tree)) if int(tree.parents[child]) == node]
            assert tree.children(node) == sorted(kids, key=lambda child: -float(tree.probs[child]))
        expected = torch.eye(len(tree), dtype=torch.bool)
        for node in range(1, len(tree)):
            expected[node] |= expected[int(tree.parents[node])]
        assert torch.equal(tree.ancestor_mask(), expected)


def test_long_decoding_stays_greedy_and_keeps_its_buffers(random_verifier_dir):
    """Hundreds of rounds across the caches' doublings: output identical to plain greedy decoding, the verifier's
    cache exactly the committed tokens, and the tree mask buffer clean after every round."""
    verifier = AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()
    drafter = random_drafter(verifier, seed=3)
    prompt = [0] + list(range(7, 200))
    sessions: list[VerifierSession] = []
    original = VerifierSession.tree_forward

    def checked(session, packed):
        sessions.append(session)
        assert session.cache.get_seq_length() == session.length
        out = original(session, packed)
        assert torch.count_nonzero(session.open_prefix_mask.buffer) == 0
        return out

    VerifierSession.tree_forward = checked
    try:
        result = SpeculativeDecoder(verifier, [drafter], TreeConfig(12, 3, 3), eos_token_ids=[]).generate(prompt, 150)
    finally:
        VerifierSession.tree_forward = original
    assert result.tokens == greedy_reference(verifier, prompt, 150, [])
    assert len(result.rounds) > 50 and sessions[-1].length == len(prompt) + len(result.tokens) - 1
