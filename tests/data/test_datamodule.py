"""DrafterDataModule on the random verifier (cached and online), and the length-bucketed batch sampler
it uses (coverage, caps, per-epoch shuffling, mid-epoch skip, DDP sharding)."""

import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DistributedSampler

from taps_train.data import feature_cache
from taps_train.data.batching import BucketBatchSampler, pad_collate
from taps_train.data.datamodule import DrafterDataModule
from taps_train.errors import TapsError
from tests.conftest import write_source

HIDDEN = 32


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


@pytest.fixture
def recipe(tmp_path) -> Path:
    math, chat = write_source(tmp_path / "math.jsonl", 16, seed=21), write_source(tmp_path / "chat.jsonl", 14, seed=22)
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "name: mixed\nseed: 0\nmax_length: 128\nsources:\n"
        f"  - {{source: jsonl, args: {{path: {math}}}, heldout: 3, count: 9}}\n"
        f"  - {{source: jsonl, args: {{path: {chat}}}, heldout: 2, count: 8}}\n"
    )
    return path


def datamodule(recipe: Path, verifier_dir: Path, tmp_path: Path, **kwargs) -> DrafterDataModule:
    kwargs = {"batch_size": 4, "max_tokens_per_batch": 300, **kwargs}
    return DrafterDataModule(str(recipe), verifier=str(verifier_dir), cache_dir=str(tmp_path / "cache"), **kwargs)


def rows(batch: dict) -> list[tuple[int, ...]]:
    """The unpadded token ids of every sample in a batch."""
    return [tuple(ids[mask].tolist()) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]


def split_samples(dm: DrafterDataModule) -> tuple[Counter, Counter]:
    train, val = Counter(), Counter()
    for source in dm._preparer().sources():
        train.update(tuple(source.samples[p].input_ids) for p in source.train_positions)
        val.update(tuple(source.samples[p].input_ids) for p in source.heldout_positions)
    return train, val


def check_batch(batch: dict, dm: DrafterDataModule, features: bool) -> None:
    size, width = batch["input_ids"].shape
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.bool and batch["loss_mask"].dtype == torch.bool
    assert batch["loss_mask"].shape == batch["attention_mask"].shape == (size, width)
    assert size <= dm.batch_size and size * width <= dm.max_tokens
    assert batch["attention_mask"][:, 0].all() and batch["attention_mask"].sum(1).max() == width  # right padding, no spare column
    assert not (batch["loss_mask"] & ~batch["attention_mask"]).any()
    assert (batch["input_ids"][~batch["attention_mask"]] == 0).all()
    if features:
        assert batch["features"].dtype == torch.float32 and batch["features"].shape == (size, width, HIDDEN)
        assert (batch["features"][~batch["attention_mask"]] == 0).all()
        assert (batch["features"][batch["attention_mask"]].abs().sum(-1) > 0).all()
    else:
        assert "features" not in batch


def test_cached_batches_feed_a_training_loop(recipe, random_verifier_dir, tmp_path):
    dm = datamodule(recipe, random_verifier_dir, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 17 and len(dm.val_set) == 5
    expected_train, expected_val = split_samples(dm)
    head = torch.nn.Linear(HIDDEN, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    seen = Counter()
    for batch in dm.train_dataloader():
        check_batch(batch, dm, features=True)
        seen.update(rows(batch))
        loss = (head(batch["features"]).squeeze(-1)[batch["loss_mask"]] ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    assert seen == expected_train  # every training sample exactly once per epoch
    val_seen = Counter(row for batch in dm.val_dataloader() for row in rows(batch))
    assert val_seen == expected_val  # validation is the held-out split ...
    assert not set(val_seen) & set(seen)  # ... which training never sees


def test_features_in_batches_are_the_cached_ones(recipe, random_verifier_dir, tmp_path):
    dm = datamodule(recipe, random_verifier_dir, tmp_path, batch_size=3)
    dm.prepare_data()
    dm.setup("fit")
    caches = {tuple(item["input_ids"].tolist()): item["features"] for part in dm.train_set.datasets for item in part}
    for batch in dm.train_dataloader():
        for row, (ids, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"])):
            assert torch.equal(batch["features"][row][mask], caches[tuple(ids[mask].tolist())])


def test_val_limit_and_setup_reuses_the_cache(recipe, random_verifier_dir, tmp_path, monkeypatch):
    datamodule(recipe, random_verifier_dir, tmp_path).prepare_data()
    monkeypatch.setattr(feature_cache, "verifier_features", lambda *a: pytest.fail("verifier ran on a cached recipe"))
    dm = datamodule(recipe, random_verifier_dir, tmp_path, val_samples_per_source=1)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.val_set) == 2 and len(dm.train_set) == 17


def test_online_mode_yields_tokens_only_and_writes_no_cache(recipe, random_verifier_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(feature_cache, "verifier_features", lambda *a: pytest.fail("online mode ran the verifier in the datamodule"))
    dm = datamodule(recipe, random_verifier_dir, tmp_path, online=True)
    dm.prepare_data()
    dm.setup("fit")
    expected_train, expected_val = split_samples(dm)
    seen = Counter()
    for batch in dm.train_dataloader():
        check_batch(batch, dm, features=False)
        seen.update(rows(batch))
    assert seen == expected_train
    assert Counter(row for batch in dm.val_dataloader() for row in rows(batch)) == expected_val
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.safetensors"))


class _CountingModule(LightningModule):
    """The smallest drafter stand-in: regress a scalar from the cached features on loss-mask tokens."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(HIDDEN, 1)
        self.first_rows: list[tuple] = []
        self.train_rows = Counter()

    def training_step(self, batch, index):
        if index == 0:
            self.first_rows.append(rows(batch)[0])
        self.train_rows.update(rows(batch))
        return (self.head(batch["features"]).squeeze(-1)[batch["loss_mask"]] ** 2).mean()

    def validation_step(self, batch, index):
        self.log("val", (self.head(batch["features"]).squeeze(-1)[batch["loss_mask"]] ** 2).mean(), batch_size=len(batch["input_ids"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_trainer_reshuffles_each_epoch(recipe, random_verifier_dir, tmp_path):
    dm = datamodule(recipe, random_verifier_dir, tmp_path, batch_size=2)
    module = _CountingModule()
    trainer = Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    expected_train, _ = split_samples(dm)
    assert module.train_rows == Counter({row: 3 * n for row, n in expected_train.items()})
    assert len(set(module.first_rows)) > 1  # set_epoch reached the batch sampler
    assert "val" in trainer.callback_metrics


# --- BucketBatchSampler -------------------------------------------------------------------------


def lengths(n: int = 203, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 400) for _ in range(n)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("max_tokens", [None, 1200])
def test_every_index_once_per_epoch_within_the_caps(shuffle, max_tokens):
    sizes = lengths()
    sampler = BucketBatchSampler(sizes, batch_size=8, max_tokens=max_tokens, shuffle=shuffle, bucket_batches=4)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(sizes)))
        assert len(batches) == len(sampler)
        for batch in batches:
            assert 1 <= len(batch) <= 8
            if max_tokens is not None and len(batch) > 1:
                assert len(batch) * max(sizes[i] for i in batch) <= max_tokens


def test_single_sample_longer_than_max_tokens_still_gets_a_batch():
    sampler = BucketBatchSampler([10, 5000, 20], batch_size=4, max_tokens=100, shuffle=False)
    assert sorted(map(sorted, sampler)) == [[0, 2], [1]]


def test_epochs_shuffle_differently_and_reproducibly():
    sizes = lengths()
    sampler = BucketBatchSampler(sizes, batch_size=8, seed=3)
    orders = []
    for epoch in (0, 1, 0):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[0] == orders[2] != orders[1]
    assert list(BucketBatchSampler(sizes, batch_size=8, seed=4)) != orders[0]
    assert list(BucketBatchSampler(sizes, batch_size=8, shuffle=False)) == list(BucketBatchSampler(sizes, batch_size=8, shuffle=False))


def test_bucketing_keeps_padding_low():
    sizes = lengths(2000)
    batches = list(BucketBatchSampler(sizes, batch_size=16, seed=1))
    padded = sum(len(b) * max(sizes[i] for i in b) for b in batches)
    rng = random.Random(0)
    order = rng.sample(range(len(sizes)), len(sizes))
    unbucketed = sum(16 * max(sizes[i] for i in order[s : s + 16]) for s in range(0, len(order), 16))
    assert padded / sum(sizes) < 1.05
    assert unbucketed / sum(sizes) > 1.5  # what bucketing saves


def test_skip_batches_resumes_mid_epoch_once():
    full = list(BucketBatchSampler(lengths(), batch_size=8, seed=2))
    sampler = BucketBatchSampler(lengths(), batch_size=8, seed=2, skip_batches=7)
    assert list(sampler) == full[7:]
    assert list(sampler) == full  # only the first iteration skips


def test_lightning_sets_the_epoch_through_the_inner_sampler():
    """Lightning calls `set_epoch` on `batch_sampler.sampler` (never on the batch sampler itself)."""
    sampler = BucketBatchSampler(lengths(), batch_size=8, seed=2)
    first = list(sampler)
    sampler.sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_get_disjoint_equal_shards(world):
    sizes = lengths()
    full = list(BucketBatchSampler(sizes, batch_size=8, seed=9))
    shards = []
    for rank in range(world):  # what Lightning injects under DDP: a DistributedSampler for this rank
        sampler = BucketBatchSampler(sizes, batch_size=8, seed=9, sampler=DistributedSampler(range(len(sizes)), num_replicas=world, rank=rank))
        shards.append(list(sampler))
        assert len(sampler) == len(shards[-1])
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(full) // world
    indices = [i for shard in shards for batch in shard for i in batch]
    assert len(indices) == len(set(indices))  # disjoint
    assert all(batch in full for shard in shards for batch in shard)  # the same global batches, split up


def test_pad_collate_right_pads_and_masks():
    items = [
        {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([False, True, True]), "features": torch.ones(3, 4)},
        {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([True]), "features": 2 * torch.ones(1, 4)},
    ]
    batch = pad_collate(items)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["loss_mask"].tolist() == [[False, True, True], [True, False, False]]
    assert batch["features"][1].tolist() == [[2.0] * 4, [0.0] * 4, [0.0] * 4]


@pytest.mark.parametrize("online", [False, True])
def test_train_on_all_puts_every_training_token_in_the_loss_and_keeps_validation_and_counts_the_assistants(
        recipe, random_verifier_dir, tmp_path, online):
    assistant = datamodule(recipe, random_verifier_dir, tmp_path, online=online)
    every = datamodule(recipe, random_verifier_dir, tmp_path, online=online, train_on="all")
    for dm in (assistant, every):
        dm.prepare_data()
        dm.setup("fit")
    masks = {name: {rows(batch)[i]: mask[batch["attention_mask"][i]] for batch in dm.train_dataloader() for i, mask in enumerate(batch["loss_mask"])}
             for name, dm in (("assistant", assistant), ("all", every))}
    assert masks["all"].keys() == masks["assistant"].keys()
    assert all(mask.all() for mask in masks["all"].values())
    assert not all(mask.all() for mask in masks["assistant"].values())  # the fixture's user turns are out of the assistant loss
    val = [{rows(batch)[i]: mask for batch in dm.val_dataloader() for i, mask in enumerate(batch["loss_mask"])} for dm in (assistant, every)]
    assert val[0].keys() == val[1].keys() and all(torch.equal(val[0][key], val[1][key]) for key in val[0])
    assert torch.equal(every.loss_token_counts(300), assistant.loss_token_counts(300))  # a draft vocabulary comes from replies


def test_an_unknown_train_on_is_refused_by_name(recipe, random_verifier_dir, tmp_path):
    with pytest.raises(TapsError, match="data.train_on 'user'.*assistant, all"):
        datamodule(recipe, random_verifier_dir, tmp_path, train_on="user")
