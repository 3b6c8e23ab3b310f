"""The options that express EAGLE's and HASS's reference training recipe (README: "Where taps-train follows
and departs from the reference implementations"): length-scaled input noise, summed alignment steps, the
linear warmup + decay schedule, value clipping where the strategy allows it, and the paper configs using them."""

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from taps_train.data.batching import pad_collate
from taps_train.errors import TapsError
from taps_train.training import Eagle2Module, HassModule

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PAPER_CONFIGS = sorted([*CONFIGS.glob("eagle2_*.yaml"), *CONFIGS.glob("hass_*.yaml")])


def batch(vocab: int, hidden: int, lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded samples of the given lengths whose second half is the assistant's reply."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for n in lengths:
        loss_mask = torch.zeros(n, dtype=torch.bool)
        loss_mask[n // 2:] = True
        items.append({"input_ids": torch.randint(0, vocab, (n,), generator=generator), "loss_mask": loss_mask,
                      "features": torch.randn(n, hidden, generator=generator)})
    return pad_collate(items)


def test_noise_width_is_constant_or_scaled_by_each_samples_length(random_verifier_dir):
    lengths = torch.tensor([40, 256, 1024])
    features = torch.zeros(3, 50, 32)
    constant = Eagle2Module(verifier=str(random_verifier_dir), feature_noise=0.2)._noise(features, lengths)
    scaled = Eagle2Module(verifier=str(random_verifier_dir), feature_noise=0.2, noise_scaling="length")._noise(features, lengths)
    # Same seed and step, so the same uniform draws u: constant noise is (u - 0.5) * 0.2 ...
    assert constant.abs().max() <= 0.1 and constant.abs().max() > 0.099
    # ... and EAGLE's/HASS's is (u - 0.5) * 0.2 * 512 / T, T each sample's own token count.
    torch.testing.assert_close(scaled, constant * 512 / lengths[:, None, None].float(), rtol=1e-6, atol=0)
    assert 1.27 < scaled[0].abs().max() <= 1.28 and scaled[2].abs().max() <= 0.05  # widths 2.56 and 0.1


def test_training_step_scales_noise_by_the_samples_token_counts_not_the_padded_width(random_verifier_dir, monkeypatch):
    module = Eagle2Module(verifier=str(random_verifier_dir), noise_scaling="length")
    seen = []
    monkeypatch.setattr(module, "_noise", lambda features, lengths: seen.append(lengths) or features)
    module.step_losses(batch(module.drafter.config.vocab_size, 32, [12, 30, 21]), train=True)
    assert seen[0].tolist() == [12, 30, 21]


def test_summed_alignment_steps_give_align_steps_times_the_gradients(random_verifier_dir):
    mean = HassModule(verifier=str(random_verifier_dir), feature_noise=0.0)
    summed = HassModule(verifier=str(random_verifier_dir), feature_noise=0.0, align_reduction="sum")
    summed.drafter.load_state_dict(mean.drafter.state_dict())
    data = batch(mean.drafter.config.vocab_size, 32, [24, 17, 31])
    losses, grads = [], []
    for module in (mean, summed):
        loss, _ = module.step_losses(data, train=True)
        loss.backward()
        losses.append(loss)
        grads.append({name: p.grad for name, p in module.drafter.named_parameters() if p.requires_grad})
    torch.testing.assert_close(losses[1], 3 * losses[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], 3 * grads[0][name], rtol=1e-5, atol=1e-7)


class RecordLr(Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_linear_schedule_warms_up_then_decays_to_exactly_zero_when_the_run_ends(random_verifier_dir, tmp_path):
    """As transformers' get_linear_schedule_with_warmup over the run's length (HASS), except that warmup
    starts at lr/warmup where it starts at 0 (one step earlier)."""
    steps, warmup, lr = 8, 3, 1e-3
    module = Eagle2Module(verifier=str(random_verifier_dir), lr=lr, warmup_steps=warmup, schedule="linear")
    data = DataLoader([batch(module.drafter.config.vocab_size, 32, [16, 20])] * steps, batch_size=None)
    record = RecordLr()
    run = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[record], default_root_dir=tmp_path)
    run.fit(module, train_dataloaders=data)

    reference = get_linear_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=lr), warmup, steps)
    expected = [reference.lr_lambdas[0](step) * lr for step in range(steps)]
    assert record.lrs[:warmup] == pytest.approx([lr * (step + 1) / warmup for step in range(warmup)])
    assert record.lrs[warmup:] == pytest.approx(expected[warmup:], abs=1e-15)
    assert record.lrs[-1] == pytest.approx(lr / (steps - warmup))
    assert run.optimizers[0].param_groups[0]["lr"] == 0.0  # after the last step, as the reference


def test_schedule_steps_fix_the_decay_horizon_whatever_the_run_length(random_verifier_dir):
    """EAGLE decays towards 0 at a fixed step count: a shorter run ends part-way down the line."""
    module = Eagle2Module(verifier=str(random_verifier_dir), lr=1.0, warmup_steps=10, schedule="linear", schedule_steps=110)
    scheduler = module.configure_optimizers_for(total_steps=60)["lr_scheduler"]["scheduler"]
    factors = [scheduler.lr_lambdas[0](step) for step in (10, 60, 110, 200)]
    assert factors == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_value_clipping_is_refused_under_deepspeed_and_norm_clipping_is_not(random_verifier_dir):
    pytest.importorskip("deepspeed")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    module = Eagle2Module(verifier=str(random_verifier_dir))
    for algorithm in ("value", "norm"):
        module.trainer = Trainer(accelerator="cpu", strategy=DeepSpeedStrategy(stage=2), gradient_clip_val=0.5,
                                 gradient_clip_algorithm=algorithm, logger=False)
        if algorithm == "value":
            with pytest.raises(TapsError, match="DeepSpeed clips gradients by norm only.*gradient_clip_algorithm: norm"):
                module.setup("fit")
        else:
            module.setup("fit")


def test_new_options_are_validated(random_verifier_dir):
    with pytest.raises(TapsError, match="unknown model.noise_scaling 'batch'"):
        Eagle2Module(verifier=str(random_verifier_dir), noise_scaling="batch")
    with pytest.raises(TapsError, match="unknown model.align_reduction 'max'"):
        HassModule(verifier=str(random_verifier_dir), align_reduction="max")
    with pytest.raises(TapsError, match="schedule_steps must be >= 1"):
        Eagle2Module(verifier=str(random_verifier_dir), schedule_steps=0)


@pytest.mark.parametrize("config", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_configs_train_with_the_reference_recipe(config):
    raw = yaml.safe_load(config.read_text())
    trainer, model = raw["trainer"], raw["model"]["init_args"]
    assert trainer["strategy"] == "ddp" and trainer["gradient_clip_algorithm"] == "value" and trainer["gradient_clip_val"] == 0.5
    assert model["noise_scaling"] == "length" and model["weight_decay"] == 0.01 and model["schedule"] == "linear"
    if raw["model"]["class_path"].endswith("HassModule"):
        assert model["align_reduction"] == "sum"
    else:
        assert model["fc_bias"] and model["schedule_steps"] == 200_000
