import torch
import torch.nn.functional as F

from taps_train.training.losses import (
    alignment_mask,
    feature_loss,
    soft_cross_entropy,
    topk_distillation,
)


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


def test_soft_cross_entropy_with_one_hot_target_is_cross_entropy():
    logits = torch.randn(5, 11)
    target = torch.randint(0, 11, (5,))
    p = F.one_hot(target, 11).float()
    torch.testing.assert_close(soft_cross_entropy(F.log_softmax(logits, -1), p), F.cross_entropy(logits, target, reduction="none"))


def test_topk_distillation_sums_over_the_verifiers_top_tokens_only():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    log_q = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    expected = -(0.5 * log_q[0, 0] + 0.3 * log_q[0, 1])
    torch.testing.assert_close(topk_distillation(log_q, p, k=2), expected[None])


def test_feature_loss_is_smooth_l1_mean_over_hidden():
    a, b = torch.zeros(2, 4), torch.tensor([[0.5] * 4, [3.0] * 4])
    torch.testing.assert_close(feature_loss(a, b), torch.tensor([0.125, 2.5]))
