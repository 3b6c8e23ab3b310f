"""A fourth backbone is one new file: a toy drafter and its training module, registered here alone, go through fit,
eval (lossless), average and export with no other file changed."""

import json

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig

from taps_train.cli import main
from taps_train.drafter import DrafterBackbone, build_drafter, drafter_config
from taps_train.drafter.backbone import register
from taps_train.features import EAGLE_FEATURES, FEATURES, FeatureContract
from taps_train.drafter.average import write_average
from taps_train.errors import TapsError
from taps_train.export import export_drafter, load_exported
from taps_train.training.base import DrafterModule, method_of
from taps_train.training.losses import feature_loss
from taps_train.verifier.loading import load_verifier

pytestmark = pytest.mark.usefixtures("taps_home")


@register("ToyDrafterForTests")
class ToyDrafter(DrafterBackbone):
    """No attention: fc over (the next token's embedding, the feature before it) predicts the next feature, which the
    verifier's LM head reads."""

    label = "toy"
    serving = {"eagle": "ToyForCausalLMEagle"}  # SGLang's layout only

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden, device="meta")
        self.fc = nn.Linear(2 * hidden, hidden)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False, device="meta")

    @classmethod
    def config_for(cls, verifier_config: PretrainedConfig) -> PretrainedConfig:
        config = drafter_config(verifier_config)
        config.architectures = [cls.architecture]
        return config

    @classmethod
    def tensor_shapes(cls, config: PretrainedConfig, bias: bool, embeddings: bool) -> dict[str, tuple[int, ...]]:
        hidden = config.hidden_size
        return {"fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,), **({"embed_tokens.weight": (config.vocab_size, hidden)} if embeddings else {})}

    def feature_contract(self) -> FeatureContract:
        return EAGLE_FEATURES

    @classmethod
    def frozen_parameter_names(cls) -> list[str]:
        return ["embed_tokens.weight", "lm_head.weight"]

    def use_verifier_parts(self, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        self.embed_tokens.weight = nn.Parameter(embedding.detach(), requires_grad=False)
        self.lm_head.weight = nn.Parameter(lm_head.detach(), requires_grad=False)

    def cast_verifier_parts(self, dtype: torch.dtype) -> None:
        self.embed_tokens.to(dtype)
        self.lm_head.to(dtype)

    def forward(self, next_ids, features, position_ids, mask, cache=None) -> torch.Tensor:
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([self.embed_tokens(next_ids).to(dtype), features.to(dtype)], dim=-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))

    def unroll(self, next_ids, features, steps):
        return [self(next_ids, features, None, None)]


class ToyModule(DrafterModule):
    drafter_class = ToyDrafter

    def __init__(self, verifier: str = "taps-tiny", toy_weight: float = 1.0, **kwargs):
        super().__init__(verifier=verifier, **kwargs)

    @classmethod
    def method_from(cls, hparams) -> str | None:
        return "toy" if "toy_weight" in hparams else None

    def make_drafter(self, verifier_config: PretrainedConfig) -> DrafterBackbone:
        return build_drafter(ToyDrafter.config_for(verifier_config))

    def step_losses(self, batch, train):
        features = self.batch_features(batch)[FEATURES]
        counts = self.loss_positions(batch["loss_mask"])
        if not counts.any():
            return self.zero_loss()
        predicted = self.drafter(batch["input_ids"][:, 1:], features[:, :-1], None, None)
        loss = self.hparams.toy_weight * feature_loss(predicted[counts], features[:, 1:][counts]).mean()
        return loss, {"loss": loss}


RECIPE = "name: toy\nseed: 0\nmax_length: 128\nsources:\n  - source: gsm_symbolic\n    args: {size: 20, seed: 3}\n    heldout: 2\n    count: 8\n"


def fit(tmp_path, verifier_dir, name: str, seed: int) -> str:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    run = tmp_path / name
    config = {
        "seed_everything": seed,
        "trainer": {"accelerator": "cpu", "max_steps": 3, "limit_val_batches": 0, "logger": False, "enable_model_summary": False,
                    "default_root_dir": str(run),
                    "callbacks": [{"class_path": "taps_train.training.checkpointing.LastCheckpoint",
                                   "init_args": {"dirpath": str(run), "save_last": True}}]},
        "model": {"class_path": f"{__name__}.ToyModule", "init_args": {"verifier": str(verifier_dir), "lr": 1e-3}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule",
                 "init_args": {"recipe": str(recipe), "verifier": str(verifier_dir), "batch_size": 4}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(config))
    main(["fit", "--config", str(path)])
    return str(run / "last.ckpt")


def test_a_toy_backbone_fits_evaluates_averages_and_exports(random_verifier_dir, tmp_path):
    first, second = fit(tmp_path, random_verifier_dir, "a", 0), fit(tmp_path, random_verifier_dir, "b", 1)
    checkpoint = torch.load(first, map_location="cpu", weights_only=True)
    assert checkpoint["taps"]["drafter_config"]["architectures"] == ["ToyDrafterForTests"]
    assert method_of(checkpoint["hyper_parameters"]) == "toy"

    main(["eval", "--drafters", first, "--verifier", str(random_verifier_dir), "--benchmarks", "math_heldout", "--prompts", "1",
          "--max-new-tokens", "6", "--total-tokens", "6", "--depth", "2", "--top-k", "2", "--temperatures", "0",
          "--output", str(tmp_path / "eval.json")])
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["benchmarks"]["math_heldout"]["acceptance_length"] >= 1.0  # decoded, and checked lossless by eval itself

    average = write_average([first, second], [0.5, 0.5], tmp_path / "average.ckpt")
    states = [torch.load(path, map_location="cpu", weights_only=True)["state_dict"] for path in (first, second, average)]
    torch.testing.assert_close(states[2]["drafter.fc.weight"], (states[0]["drafter.fc.weight"] + states[1]["drafter.fc.weight"]) / 2)

    out = export_drafter(average, tmp_path / "export", verifier=str(random_verifier_dir), dtype="float32")
    provenance = json.loads((out / "taps_export.json").read_text())
    assert provenance["architecture"] == "ToyForCausalLMEagle" and provenance["backbone"]["name"] == "ToyDrafterForTests"
    verifier = load_verifier(str(random_verifier_dir)).model
    loaded = load_exported(out, verifier)
    assert isinstance(loaded, ToyDrafter)
    assert torch.equal(loaded.fc.weight, states[2]["drafter.fc.weight"].float())
    with pytest.raises(TapsError, match="is an toy drafter; the vllm layout holds .* drafts only. Use --format eagle"):
        export_drafter(first, tmp_path / "vllm", verifier=str(random_verifier_dir), layout="vllm")
