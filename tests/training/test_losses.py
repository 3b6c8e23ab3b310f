import torch
import torch.nn.functional as F

from taps_train.drafter.model import alignment_mask
from taps_train.training.losses import feature_loss, vocab_losses


def test_alignment_mask_on_six_tokens_matches_hand_written_expectation():
    # Step 1 is plain causal attention over the true-feature keys.
    assert torch.equal(alignment_mask(6, 1), torch.ones(6, 6, dtype=torch.bool).tril())
    # Step 2: keys [true block | step-2 block]. Query s sees true keys j <= s-1 and its own step-2 key.
    expected_2 = torch.tensor(
        [
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(alignment_mask(6, 2), expected_2)
    # Step 3: [true | step 2 | step 3]. Query s: true keys j <= s-2, step-2 key at s-1, own step-3 key.
    expected_3 = torch.tensor(
        [
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(alignment_mask(6, 3), expected_3)


def test_every_query_sees_each_context_position_exactly_once():
    for step in (1, 2, 3, 4):
        mask = alignment_mask(9, step).view(9, step, 9).sum(1)
        assert torch.equal(mask, torch.ones(9, 9, dtype=torch.long).tril())


# With an identity LM head, features are logits: softmax(target) is the verifier's p, softmax(predicted) the drafter's q.
def test_soft_cross_entropy_with_a_one_hot_verifier_is_cross_entropy():
    logits = torch.randn(5, 11)
    target = torch.randint(0, 11, (5,))
    one_hot_logits = 200.0 * F.one_hot(target, 11).float()  # softmax is one-hot to float precision
    _, terms = vocab_losses(logits, one_hot_logits, torch.eye(11), chunk_size=2)
    torch.testing.assert_close(terms["prob_loss"], F.cross_entropy(logits, target))


def test_topk_distillation_sums_over_the_verifiers_top_tokens_only():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    expected = -(0.5 * q[0, 0].log() + 0.3 * q[0, 1].log())
    _, terms = vocab_losses(q.log(), p.log(), torch.eye(4), topk_weight=1.0, topk=2, accuracy_topk=1)
    torch.testing.assert_close(terms["topk_loss"], expected)
    assert terms["acc_top1"] == 0.0  # the drafter's argmax (3) is not the verifier's (0)


def test_feature_loss_is_smooth_l1_mean_over_hidden():
    a, b = torch.zeros(2, 4), torch.tensor([[0.5] * 4, [3.0] * 4])
    torch.testing.assert_close(feature_loss(a, b), torch.tensor([0.125, 2.5]))
