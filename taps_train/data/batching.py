"""Length-bucketed batching and padding for drafter training.

Conversations vary from 50 to 2,000 tokens; batching similar lengths keeps padding low. The batch
sampler shards whole batches across DDP ranks, reshuffles per epoch through `set_epoch`, and can skip
the batches a resumed run already consumed.
"""

import random
from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DistributedSampler


class BucketBatchSampler(BatchSampler):
    """Yield lists of dataset indices: shuffled, bucketed by length, capped by count and tokens.

    Epoch, rank and world size are read from `self.sampler`, a `DistributedSampler` over the indices:
    under DDP Lightning swaps in its own (right rank, and it calls `set_epoch` on it each epoch);
    alone we use a single-replica one. Its index order is not used: bucketing decides the order.
    """

    def __init__(self, lengths: list[int], batch_size: int, max_tokens: int | None = None, shuffle: bool = True,
                 seed: int = 0, skip_batches: int = 0, sampler: DistributedSampler | None = None, bucket_batches: int = 64):
        """`skip_batches`: the first iteration starts after that many batches (exact mid-epoch resume)."""
        if sampler is None:
            sampler = DistributedSampler(range(len(lengths)), num_replicas=1, rank=0, shuffle=False)
        super().__init__(sampler, batch_size, drop_last=False)
        self.lengths = lengths
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.bucket = batch_size * bucket_batches
        self._skip = skip_batches

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _all_batches(self) -> list[list[int]]:
        """Batches are composed once (seeded) and only their order changes per epoch, so every epoch
        has the same number of batches, which Lightning counts once."""
        order = list(range(len(self.lengths)))
        if self.shuffle:
            random.Random(self.seed).shuffle(order)
        batches = []
        for start in range(0, len(order), self.bucket):
            bucket = sorted(order[start : start + self.bucket], key=lambda i: self.lengths[i])
            batches += self._split(bucket)
        if self.shuffle:
            random.Random(self.seed * 7919 + self.sampler.epoch).shuffle(batches)
        return batches

    def _split(self, indices: list[int]) -> list[list[int]]:
        return split_by_length(indices, self.lengths, self.max_tokens, self.batch_size)

    def _rank_batches(self) -> list[list[int]]:
        batches = self._all_batches()
        rank, world = self.sampler.rank, self.sampler.num_replicas
        per_rank = len(batches) // world  # equal counts keep ranks in lockstep
        return batches[rank * per_rank : (rank + 1) * per_rank]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches()[self._skip :]
        self._skip = 0
        yield from batches

    def __len__(self) -> int:
        """Batches per epoch on this rank, skipped ones included (the trainer counts those as done)."""
        return len(self._rank_batches())


def split_by_length(ascending: list[int], lengths: list[int], max_tokens: int | None, max_count: int | None = None) -> list[list[int]]:
    """Cut indices sorted by ascending length into consecutive batches whose padded size (count x
    longest, i.e. the newest index) stays within `max_tokens` and whose count within `max_count`."""
    batches, current = [], []
    for index in ascending:
        too_many_tokens = max_tokens is not None and current and (len(current) + 1) * lengths[index] > max_tokens
        if current and (len(current) == max_count or too_many_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def pad_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad every per-token tensor of the items (`input_ids`, `loss_mask`, and whatever a feature contract
    stores, such as `features` [T, W]); add `attention_mask`."""
    width = max(len(item["input_ids"]) for item in items)
    batch = {key: value.new_zeros((len(items), width, *value.shape[1:])) for key, value in items[0].items()}
    batch["attention_mask"] = torch.zeros(len(items), width, dtype=torch.bool)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        for key, value in item.items():
            batch[key][row, :n] = value
        batch["attention_mask"][row, :n] = True
    return batch
