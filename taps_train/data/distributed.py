"""Several processes building one feature cache: who builds which shard, and how the ranks agree.

`taps-train cache` under torchrun and a multi-rank `fit` run the same build on every rank. The ranks
talk through a gloo group of their own whose timeout (`BUILD_TIMEOUT`) is sized for a build, not the
30 minutes of the training collectives: a rank that finishes its shards early waits there for the
slowest. Only small things travel through it (shard records, error messages); features never do. A
rank that dies closes its connections, so the others fail at once instead of waiting out the timeout.
"""

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from taps_train.errors import TapsError
from taps_train.verifier.placement import AUTO_SHARD

BUILD_TIMEOUT = timedelta(days=7)
# A network filesystem may show another node's new file a little late (attribute caching); a disk only
# the writer's node mounts never shows it.
SHARED_FS_GRACE_S = 30.0

T = TypeVar("T")


class CacheNotShared(TapsError):
    """A rank cannot see files another rank has: the cache dir is not on a filesystem shared by all nodes."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a build: `group` is the build's gloo group (None: the default group)."""

    rank: int = 0
    world: int = 1
    group: dist.ProcessGroup | None = None

    @property
    def label(self) -> str:
        """Prefix for this rank's progress bars and messages (none for a single process)."""
        return f"rank {self.rank}: " if self.world > 1 else ""

    def owns(self, shard: int) -> bool:
        return shard % self.world == self.rank

    def gather(self, value: T) -> list[T]:
        """Every rank's `value` (small, picklable), in rank order."""
        if self.world == 1:
            return [value]
        values = [None] * self.world
        dist.all_gather_object(values, value, group=self.group)
        return values

    def agree(self, work: Callable[[], T]) -> T:
        """Run `work` on this rank; a TapsError on any rank is raised on every rank, so they all stop with
        the same one-line message instead of the healthy ones waiting on a dead peer."""
        try:
            value, error = work(), None
        except TapsError as err:
            value, error = None, err
        failures = [e for e in self.gather(error) if e is not None]
        if failures:
            raise failures[0]
        return value

    def rank_zero_first(self, work: Callable[[], T]) -> T:
        """Rank 0 runs `work` alone (it may write files, e.g. regenerated replies), then the others run it."""
        first = self.agree(work if self.rank == 0 else lambda: None)
        return self.agree(lambda: first) if self.rank == 0 else self.agree(work)


def several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def build_ranks() -> Iterator[Ranks]:
    """The ranks of a running job (e.g. Lightning's), over a new gloo group sized for a build; the job's own
    collectives keep their timeout. Every rank must enter it (creating a group is collective)."""
    if not several_ranks():
        yield Ranks()
        return
    group = dist.new_group(backend="gloo", timeout=BUILD_TIMEOUT)
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size(), group)
    finally:
        dist.destroy_process_group(group)


@contextmanager
def launched_ranks() -> Iterator[Ranks]:
    """The ranks of a command torchrun started (WORLD_SIZE > 1): joins its rendezvous over gloo, sized for a
    build, and puts this rank on its own GPU (cuda:LOCAL_RANK) so that `--device auto` means that GPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield Ranks()
        return
    _use_local_gpu(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="gloo", timeout=BUILD_TIMEOUT)
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


def _use_local_gpu(local_rank: int) -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return
    if count > 1 and local_rank >= count:
        raise TapsError(f"LOCAL_RANK {local_rank}, but this node has {count} CUDA devices; start at most {count} processes per node "
                        f"(torchrun --nproc_per_node {count})")
    torch.cuda.set_device(local_rank if count > 1 else 0)  # one visible device: the launcher gave each rank its own


def pinned_device(device: str) -> bool:
    """`cuda:N` and `auto-shard` name the same GPU(s) on every rank: N ranks would stack N verifiers there."""
    name = device.strip().lower()
    return name == AUTO_SHARD or name.startswith("cuda:")


def wait_until_visible(files: list[tuple[Path, int | None, int]], rank: int, grace_s: float = SHARED_FS_GRACE_S) -> None:
    """Return once this rank sees every `(path, size or None, rank that has it)`; give up after `grace_s`."""
    deadline = time.monotonic() + grace_s
    for path, size, owner in files:
        while not _present(path, size):
            if time.monotonic() > deadline:
                raise CacheNotShared(f"rank {rank} cannot see {path}, which rank {owner} has (waited {grace_s:.0f} s): "
                                     "the feature cache dir must be on a filesystem shared by all nodes")
            time.sleep(1.0)


def _present(path: Path, size: int | None) -> bool:
    try:
        actual = path.stat().st_size
    except FileNotFoundError:
        return False
    return size is None or actual == size
