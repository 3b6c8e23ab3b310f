"""model.optimizer: muon (Muon on the drafter's hidden matrices, AdamW on the rest) with the real Lightning Trainer."""

import pytest
import torch
from lightning.pytorch import Trainer

from taps_train.errors import TapsError
from taps_train.training import Eagle2Module, Eagle3Module, HassModule
from taps_train.training.optimizers import OPTIMIZERS, MuonAdamW, muon_parameters
from tests.training.test_training import data, drafter_weights, recipe, seeded_hass, trainer  # noqa: F401


def test_muon_takes_the_hidden_matrices_and_adamw_the_head_norms_and_biases(random_verifier_dir):
    drafter = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, optimizer="muon").drafter
    muon, adamw = muon_parameters(drafter.named_parameters())
    names = {id(p): name for name, p in drafter.named_parameters()}
    muon_names, adamw_names = {names[id(p)] for p in muon}, {names[id(p)] for p in adamw}
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= muon_names
    assert {"lm_head.weight", "norm.weight", "midlayer.hidden_norm.weight"} <= adamw_names
    assert "embed_tokens.weight" not in muon_names | adamw_names  # frozen: nobody's
    assert muon_names | adamw_names == {name for name, p in drafter.named_parameters() if p.requires_grad}


def test_the_schedule_sets_the_rate_both_optimizers_step_with(random_verifier_dir):
    module = HassModule(verifier=str(random_verifier_dir), optimizer="muon", lr=1.0, warmup_steps=10, schedule="linear")
    config = module.configure_optimizers_for(total_steps=20)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(optimizer, MuonAdamW) and [type(o).__name__ for o in optimizer.inner] == ["Muon", "AdamW"]
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert [group["lr"] for inner in optimizer.inner for group in inner.param_groups] == pytest.approx([0.6, 0.6])  # warmup's 6th step


def test_muon_trains_other_weights_than_adamw(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    """The optimizer choice reaches the run (its resume is tested with AdamW's in test_training.py)."""
    weights = {}
    for optimizer in OPTIMIZERS:
        module = seeded_hass(random_verifier_dir, optimizer)
        trainer(tmp_path / optimizer, max_steps=5, enable_checkpointing=False).fit(module, datamodule=data(recipe, random_verifier_dir))
        weights[optimizer] = drafter_weights(module)["fc.weight"]
    assert not torch.allclose(weights["adamw"], weights["muon"])


def test_eagle3_training_with_muon_lowers_the_loss(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, optimizer="muon", lr=3e-3, ttt_steps=2)
    dm = data(recipe, random_verifier_dir, verifier_states=module.drafter.feature_contract().layers)
    trainer(tmp_path, max_steps=1, enable_checkpointing=False).fit(module, datamodule=dm)  # chooses the vocabulary
    batch = next(iter(dm.train_dataloader()))
    before = module.step_losses(batch, train=False)[0]
    trainer(tmp_path, max_steps=25, enable_checkpointing=False).fit(module, datamodule=dm)
    # A random verifier's distribution is nearly uniform (the loss stays near ln 64 whatever the drafter does); Muon and
    # AdamW (the trained head) still take it down.
    assert module.step_losses(batch, train=False)[0] < before - 0.1


def test_unknown_optimizers_and_muon_under_deepspeed_are_refused(random_verifier_dir):
    with pytest.raises(TapsError, match="unknown model.optimizer 'sgd'; use one of"):
        Eagle2Module(verifier=str(random_verifier_dir), optimizer="sgd")
    pytest.importorskip("deepspeed")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    module = Eagle2Module(verifier=str(random_verifier_dir), optimizer="muon")
    module.trainer = Trainer(accelerator="cpu", strategy=DeepSpeedStrategy(stage=2), gradient_clip_algorithm="norm", logger=False)
    with pytest.raises(TapsError, match="model.optimizer muon needs whole weight matrices.*strategy: ddp"):
        module.setup("fit")
