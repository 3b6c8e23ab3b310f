"""The verifier feature cache: packed, checksummed, resumable, fingerprinted.

Layout of one cache directory (one per verifier x source selection x max length x dtype):

    manifest.json             fingerprint, shard list (position range, bytes, sha256), build report
    shard-00000.safetensors   the feature contract's per-token tensors (`features` [T, W], and
                              `targets` [T, H] where the backbone needs them apart), input_ids [T]
                              int32, loss_mask [T] uint8, offsets [n+1] int64 (per-sample token
                              ranges), per-token fp8 scales (`scales` for features, `<name>_scales`
                              for the others; fp8 only)
    shard-00003-3200.safetensors  a last shard short of `shard_samples` (here positions 3072:3200), named by its
                              end too, so that a larger build of the directory writes its whole shard-00003 beside it

Samples are addressed by *position* in the source's seeded permutation (held-out first, then
training), so a cache of N samples serves every recipe that needs a prefix of them: mixtures are
index views and cost no feature bytes. Each shard covers a fixed range of positions and is written
atomically (temporary file, then rename), so shards can be written by several ranks of a build at
once, and a killed build resumes and ends byte-identical to an uninterrupted one. A shard of a large
verifier takes hours on a CPU, so while one is computed its finished batches are saved every
`CacheSettings.checkpoint_s` seconds (`SavedBatches`, in `.shard-NNNNN.partial/`): a kill loses at most
that long plus one batch of verifier work, and the next build of the shard, on any rank or host,
continues from them. The manifest is written once, when every shard exists. Two builds of one
directory take turns (`RecipePreparer.build` locks it), so the second finds the shards done.

What is stored is the drafter backbone's feature contract (taps_train/features.py): for
EAGLE-1/2 and HASS the verifier's post-norm last hidden state alone, so the verifier's LM head applies
to it directly. The contract is part of the fingerprint.
"""

import bisect
import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from taps_train import files
from taps_train.data.batching import split_by_length
from taps_train.data.chat_format import TokenizedSample
from taps_train.features import EAGLE_FEATURES, FEATURES, TARGETS, FeatureContract
from taps_train.errors import TapsError
from taps_train.hashing import file_sha256
from taps_train.units import size

FORMAT = 1
FP8_MAX = 448.0  # largest finite float8_e4m3fn value
STORAGE_DTYPES = ("bfloat16", "fp8_e4m3")


@dataclass(frozen=True)
class CacheSettings:
    dtype: str = "bfloat16"
    shard_samples: int = 1024
    batch_tokens: int = 16384  # verifier forward batch budget (padded tokens)
    # Seconds of verifier work between saves of a shard's finished batches: what a kill may lose (plus one batch).
    # A save writes only the batches since the previous one: a shard's bytes are written at most twice, whatever the interval.
    checkpoint_s: float = 60.0

    def __post_init__(self):
        if self.dtype not in STORAGE_DTYPES:
            raise TapsError(f"unknown feature cache dtype {self.dtype!r}; use one of {STORAGE_DTYPES}")
        if not self.checkpoint_s >= 0:
            raise TapsError(f"feature cache checkpoint_s must be >= 0 seconds, got {self.checkpoint_s!r}")


def bytes_per_token(widths: Iterable[int], dtype: str) -> int:
    """Stored bytes per token: each per-token tensor of width w (+ its fp8 scale) + int32 id + uint8 mask."""
    return sum(2 * width if dtype == "bfloat16" else width + 4 for width in widths) + 4 + 1


SHARD_HEADER_BYTES = 4096  # safetensors JSON header (tensor names, dtypes, offsets, metadata), rounded up
DISK_MARGIN = 1.02  # filesystem blocks and the manifest; better refuse a little early than fail mid-shard


def shard_bytes_bound(tokens: int, samples: int, shards: int, widths: Iterable[int], dtype: str) -> int:
    """Bytes the shards of `tokens` tokens in `samples` samples will take, headers and offsets included."""
    payload = tokens * bytes_per_token(widths, dtype) + 8 * (samples + shards) + SHARD_HEADER_BYTES * shards
    return int(payload * DISK_MARGIN)


def shard_ranges(num_samples: int, shard_samples: int) -> list[tuple[int, int]]:
    return [(start, min(start + shard_samples, num_samples)) for start in range(0, num_samples, shard_samples)]


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group indices of similar length so each padded verifier batch stays within `batch_tokens`."""
    return split_by_length(sorted(range(len(lengths)), key=lambda i: lengths[i]), lengths, batch_tokens)


@torch.no_grad()
def verifier_features(model: torch.nn.Module, samples: list[TokenizedSample], pad_id: int,
                      contract: FeatureContract = EAGLE_FEATURES) -> dict[str, torch.Tensor]:
    """The contract's named tensors of right-padded `samples`, the samples' tokens concatenated: [Σ len, W] each."""
    device = next(model.parameters()).device
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample.input_ids)] = torch.tensor(sample.input_ids)
        attention[row, : len(sample.input_ids)] = 1
    out = model.base_model(input_ids=ids.to(device), attention_mask=attention.to(device), output_hidden_states=contract.hidden_state_indices)
    return {name: torch.cat([hidden[row, : len(sample.input_ids)] for row, sample in enumerate(samples)])
            for name, hidden in contract.extract(out.hidden_states).items()}


def _scales_key(name: str) -> str:
    """The fp8 scales of the `features` keep the name caches had before other tensors were stored."""
    return "scales" if name == FEATURES else f"{name}_scales"


def _encode(name: str, values: torch.Tensor, dtype: str) -> dict[str, torch.Tensor]:
    if dtype == "bfloat16":
        return {name: values.to(torch.bfloat16).cpu()}
    values = values.float()
    scales = (values.abs().amax(dim=-1) / FP8_MAX).clamp_min(1e-12)
    return {name: (values / scales[:, None]).to(torch.float8_e4m3fn).cpu(), _scales_key(name): scales.cpu()}


def _encoded_batch(model, contract: FeatureContract, samples: list[TokenizedSample], pad_id: int, dtype: str) -> dict[str, torch.Tensor]:
    """One verifier batch as a shard keeps it: encoded for storage, on the CPU, the samples' tokens concatenated."""
    return {key: encoded for name, values in verifier_features(model, samples, pad_id, contract).items()
            for key, encoded in _encode(name, values, dtype).items()}


@dataclass(frozen=True)
class Throughput:
    """One timed verifier forward: `tokens` real (unpadded) tokens of the first `samples` of a build's batch of
    `batch_samples`, in `seconds`."""

    tokens: int
    samples: int
    batch_samples: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


PROBE_SECONDS = 2.0  # shortest timed forward worth trusting (timer noise, first-call effects, a machine shared with others)


def measure_throughput(model, contract: FeatureContract, samples: list[TokenizedSample], pad_id: int, settings: CacheSettings,
                       min_seconds: float = PROBE_SECONDS) -> Throughput:
    """Time a build's per-batch work (forward, encoding, copy to the CPU) on the batch of `samples` (a shard's) that
    holds their median-length sample, cut as the build cuts it, after a one-sample warm-up (lazy initialisation,
    kernel choice). Its rows double from one until a forward takes `min_seconds` or the batch is whole: a GPU,
    where batching pays, gets its whole batch; a slow CPU, as fast per token with one row, stops within seconds."""
    lengths = [len(s.input_ids) for s in samples]
    median = sorted(range(len(samples)), key=lengths.__getitem__)[len(samples) // 2]
    batch = next(b for b in length_batches(lengths, settings.batch_tokens) if median in b)
    _encoded_batch(model, contract, [samples[batch[0]]], pad_id, settings.dtype)
    rows = 1
    while True:
        chosen = [samples[i] for i in batch[:rows]]
        start = time.perf_counter()
        _encoded_batch(model, contract, chosen, pad_id, settings.dtype)
        seconds = time.perf_counter() - start
        if seconds >= min_seconds or rows == len(batch):
            return Throughput(sum(len(s.input_ids) for s in chosen), rows, len(batch), seconds)
        rows = min(2 * rows, len(batch))


@dataclass(frozen=True)
class ShardWriter:
    """Fills shards of feature caches. `verifier` is called only when a shard must be computed, so a resumed
    or complete build never loads the model; `label` prefixes the progress bar (e.g. "rank 1: ")."""

    verifier: Callable[[], torch.nn.Module]
    contract: FeatureContract
    hidden_size: int
    settings: CacheSettings
    pad_id: int
    label: str = ""

    def fill(self, samples: list[TokenizedSample], directory: Path, fingerprint: dict, spans: list[tuple[int, int]]) -> list[dict]:
        """The records of shards `spans` of the cache of `samples` at `directory`, computing only the missing ones.

        A shard counts as present when the manifest lists it (size checked) or when its file is complete
        and covers the span (left by a build killed before it wrote the manifest, on any rank).
        """
        directory.mkdir(parents=True, exist_ok=True)
        listed = _listed_shards(directory, fingerprint)
        records = {span: listed.get(span) or _adopt(directory, span, self.settings) for span in spans}
        for span, record in records.items():
            if record is not None:  # saved batches outlive their shard only if a kill came between the two
                shutil.rmtree(_partial_dir(directory, span, self.settings), ignore_errors=True)
        todo = [span for span, record in records.items() if record is None]
        if todo:
            records.update(self._compute(samples, directory, todo))
        return [records[span] for span in spans]

    def _compute(self, samples: list[TokenizedSample], directory: Path, todo: list[tuple[int, int]]) -> dict[tuple[int, int], dict]:
        sizes = [sum(len(samples[i].input_ids) for i in range(a, b)) for a, b in todo]
        # The largest shard counts twice: its saved batches stay on disk until the shard itself is written.
        _check_disk(directory, shard_bytes_bound(sum(sizes) + max(sizes), sum(b - a for a, b in todo), len(todo),
                                                 self.contract.widths(self.hidden_size).values(), self.settings.dtype))
        model = self.verifier()
        with tqdm(total=sum(sizes), desc=f"{self.label}caching features ({directory.name})", unit="tok", unit_scale=True) as bar:
            return {(a, b): _write_shard(model, self.contract, samples[a:b], directory, (a, b), self.settings, self.pad_id, bar)
                    for a, b in todo}


def pending_tokens(samples: list[TokenizedSample], directory: Path, fingerprint: dict, spans: list[tuple[int, int]],
                   settings: CacheSettings) -> int:
    """Tokens the verifier must still run to fill shards `spans` of the cache of `samples` at `directory`: shards on
    disk and batches that killed builds saved do not count. Reads file names and headers only, no checksums."""
    listed = _listed_shards(directory, fingerprint)
    pending = 0
    for a, b in spans:
        if (a, b) in listed or _whole_shard_tokens(directory / _shard_name((a, b), settings), (a, b)) is not None:
            continue
        saved = SavedBatches.plan(directory, (a, b), samples[a:b], settings)
        pending += sum(saved.tokens) - saved.saved_tokens()
    return pending


def write_manifest(directory: Path, fingerprint: dict, shards: list[dict], samples: int, report: dict) -> None:
    """Written once every shard exists; left untouched when nothing changed, so a no-op build rewrites nothing."""
    manifest = {"format": FORMAT, "fingerprint": fingerprint, "shards": shards, "samples": samples, "report": report}
    if _read_manifest(directory) != manifest:
        _write_manifest(directory, manifest)
    _remove_superseded_short_shards(directory, {shard["file"] for shard in shards}, samples)


def _remove_superseded_short_shards(directory: Path, listed: set[str], samples: int) -> None:
    """Smaller builds' short last shards that the manifest's `samples` now cover: no manifest lists them any more."""
    for path in directory.glob("shard-*-*.safetensors"):
        match = _SHARD_FILE.match(path.name)
        if match and path.name not in listed and int(match["end"]) <= samples:
            path.unlink(missing_ok=True)


def _shard_name(span: tuple[int, int], settings: CacheSettings) -> str:
    """A last shard short of `shard_samples` is named by its end too: a larger build of the same directory (a
    learning curve's next size) writes its whole shard beside it, not over it, so the smaller cache stays readable
    until the larger one's manifest replaces its own."""
    index = span[0] // settings.shard_samples
    short = span[1] - span[0] < settings.shard_samples
    return f"shard-{index:05d}-{span[1]}.safetensors" if short else f"shard-{index:05d}.safetensors"


def _write_shard(model, contract: FeatureContract, samples, directory: Path, span: tuple[int, int], settings: CacheSettings,
                 pad_id: int, bar) -> dict:
    # Each batch is encoded (and moved off the verifier's device) as it comes out: a shard never holds its
    # fp32 features, which for an 8B verifier is ~16 GB per 1k conversations. Encoding is per token, so the
    # bytes equal those of encoding the whole shard at once, and batches read back from a save equal the
    # batches computed.
    saved = SavedBatches.plan(directory, span, samples, settings)
    encoded = saved.load()
    bar.total -= sum(saved.tokens[: len(encoded)])
    bar.refresh()
    last_save, clock = len(encoded), time.monotonic()
    for batch in saved.batches[len(encoded):]:
        encoded.append(_encoded_batch(model, contract, [samples[i] for i in batch], pad_id, settings.dtype))
        bar.update(saved.tokens[len(encoded) - 1])
        if len(encoded) < len(saved.batches) and time.monotonic() - clock >= settings.checkpoint_s:
            saved.save(encoded, last_save)
            last_save, clock = len(encoded), time.monotonic()
    tensors = _shard_tensors(samples, saved.batches, encoded)
    name = _shard_name(span, settings)
    with _fresh_file(directory, name) as tmp:
        # One metadata key: safetensors writes a multi-key metadata map in random order, and a resumed build
        # must be byte-identical to an uninterrupted one.
        save_file(tensors, tmp, metadata=_positions(span))
        record = _record(tmp, name, span, int(tensors["offsets"][-1]))
    saved.discard()
    return record


def _shard_tensors(samples: list[TokenizedSample], batches: list[list[int]], encoded: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A shard's tensors in sample order, from its batches (in length order) as `_encoded_batch` gave them."""
    columns: dict[str, list[torch.Tensor | None]] = {}
    for batch, values in zip(batches, encoded):
        sizes = [len(samples[i].input_ids) for i in batch]
        for key, value in values.items():
            column = columns.setdefault(key, [None] * len(samples))
            for index, piece in zip(batch, value.split(sizes)):
                column[index] = piece
    lengths = torch.tensor([0] + [len(s.input_ids) for s in samples])
    return {
        **{key: torch.cat(column) for key, column in columns.items()},
        "input_ids": torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.int32),
        "loss_mask": torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.uint8),
        "offsets": torch.cumsum(lengths, 0),
    }


def _partial_dir(directory: Path, span: tuple[int, int], settings: CacheSettings) -> Path:
    return directory / f".{_shard_name(span, settings).removesuffix('.safetensors')}.partial"


_PART_FILE = re.compile(r"^batches-(?P<start>\d+)-(?P<end>\d+)\.safetensors$")


@dataclass(frozen=True)
class SavedBatches:
    """The finished batches of a shard in progress, saved so that a killed build resumes inside the shard.

    `batches-A-B.safetensors` in the shard's `.shard-NNNNN.partial/` holds batches A..B-1 of the shard's plan
    (per tensor, those batches' encoded values concatenated). Each save writes only the batches since the
    previous one, atomically, and the files are read back as the chain of ranges from batch 0. Their metadata
    names the span and the plan (each batch's samples and lengths): a build reuses them only if it cuts the shard
    into the same batches, so its shard equals an uninterrupted build's byte for byte. Whoever builds the shard
    next (this host or another, any rank) reuses them: one build at a time writes a directory (its lock) and one
    rank of it a shard, and a file's bytes depend on its batches alone, not on which process computed them.
    """

    folder: Path
    batches: list[list[int]]
    tokens: list[int]  # real tokens of each batch
    metadata: dict[str, str]

    @classmethod
    def plan(cls, directory: Path, span: tuple[int, int], samples: list[TokenizedSample], settings: CacheSettings) -> "SavedBatches":
        lengths = [len(s.input_ids) for s in samples]
        batches = length_batches(lengths, settings.batch_tokens)
        plan = hashlib.sha256(json.dumps([[(i, lengths[i]) for i in batch] for batch in batches]).encode()).hexdigest()
        return cls(_partial_dir(directory, span, settings), batches, [sum(lengths[i] for i in batch) for batch in batches],
                   {**_positions(span), "plan": plan})

    def chain(self) -> list[tuple[int, int, Path]]:
        """(first batch, end, file) of the saved files of this plan that continue each other from batch 0."""
        ranges = {}
        for path in self.folder.glob("batches-*.safetensors"):
            match = _PART_FILE.match(path.name)
            if match and int(match["start"]) < int(match["end"]) <= len(self.batches):
                ranges[int(match["start"])] = (int(match["end"]), path)
        chain, start = [], 0
        while start in ranges and self._matches(ranges[start][1]):
            end, path = ranges[start]
            chain.append((start, end, path))
            start = end
        return chain

    def saved_tokens(self) -> int:
        return sum(sum(self.tokens[start:end]) for start, end, _ in self.chain())

    def load(self) -> list[dict[str, torch.Tensor]]:
        """The saved batches, encoded; removes the files this plan cannot use (another plan's, after a gap, or a killed
        save's temporary): the caller builds the shard now, and no one else does (see the class docstring)."""
        if not self.folder.is_dir():
            return []
        chain = self.chain()
        for path in set(self.folder.iterdir()) - {path for _, _, path in chain}:
            path.unlink()
        encoded = []
        for start, end, path in chain:
            with safe_open(str(path), framework="pt") as handle:
                pieces = {key: handle.get_tensor(key).split(self.tokens[start:end]) for key in handle.keys()}
            encoded += [{key: values[batch] for key, values in pieces.items()} for batch in range(end - start)]
        return encoded

    def save(self, encoded: list[dict[str, torch.Tensor]], start: int) -> None:
        """Save the batches of `encoded` from `start` on (those since the previous save)."""
        name = f"batches-{start:05d}-{len(encoded):05d}.safetensors"
        self.folder.mkdir(exist_ok=True)
        with _fresh_file(self.folder, name) as tmp:
            save_file({key: torch.cat([values[key] for values in encoded[start:]]) for key in encoded[start]}, tmp, metadata=self.metadata)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def _matches(self, path: Path) -> bool:
        try:
            with safe_open(str(path), framework="pt") as handle:
                return handle.metadata() == self.metadata
        except SafetensorError:
            return False


def _positions(span: tuple[int, int]) -> dict[str, str]:
    return {"positions": f"{span[0]}:{span[1]}"}


def _record(path: Path, name: str, span: tuple[int, int], tokens: int) -> dict:
    return {"file": name, "start": span[0], "end": span[1], "tokens": tokens, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _adopt(directory: Path, span: tuple[int, int], settings: CacheSettings) -> dict | None:
    """The record of a shard file no manifest lists yet, if it is whole and covers the span."""
    name = _shard_name(span, settings)
    tokens = _whole_shard_tokens(directory / name, span)
    return None if tokens is None else _record(directory / name, name, span, tokens)


def _whole_shard_tokens(path: Path, span: tuple[int, int]) -> int | None:
    """Tokens of the shard file at `path`, or None if there is none for `span`. A file there is whole (renamed into
    place only when complete); its positions must be this span's, since an older, shorter build may have left a
    partial last shard."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            if handle.metadata() != _positions(span):
                return None
            return int(handle.get_tensor("offsets")[-1])
    except SafetensorError:
        return None


@contextmanager
def _fresh_file(directory: Path, name: str) -> Iterator[Path]:
    """`files.atomic_file` for `name`, after removing what killed writers of `name` left behind. Only one process
    ever writes a given file (a shard's owner, its saved batches too, or rank 0 for the manifest), and only one
    build at a time writes a directory (its lock)."""
    for stale in directory.glob(f".{name}.*.tmp"):
        stale.unlink(missing_ok=True)
    with files.atomic_file(directory / name) as tmp:
        yield tmp


_TMP_FILE = re.compile(r"^\.(?:shard-\d{5}(?:-\d+)?\.safetensors|manifest\.json|batches-\d+-\d+\.safetensors)\..+\.tmp$")


def remove_stale_temporaries(directory: Path) -> tuple[int, int]:
    """Remove the temporaries that writers on this host left when killed (saved batches' included); (files, bytes)
    removed. Call it with the directory's lock held. A temporary of another host (a shared filesystem) is left
    alone: whether its writer lives cannot be told from here. Saved batches are progress, not temporaries: they
    stay until their shard is written."""
    candidates = [*directory.glob(".*.tmp"), *directory.glob(".shard-*.partial/.*.tmp")]
    return files.remove_dead_leftovers([path for path in candidates if _TMP_FILE.match(path.name)])


class FeatureCache:
    """Read side: sample `position` -> {input_ids, loss_mask, features}; shards memory-mapped, each
    checked against its SHA-256 the first time this process opens it."""

    def __init__(self, directory: str | Path, fingerprint: dict | None = None):
        self.directory = Path(directory)
        manifest = _read_manifest(self.directory) if fingerprint is None else _matching_manifest(self.directory, fingerprint)
        if manifest is None:
            raise TapsError(f"no feature cache at {self.directory}; build it with `taps-train cache --recipe <recipe>`")
        self.manifest = manifest
        self.shards = manifest["shards"]
        for shard in self.shards:
            if not _shard_intact_size(self.directory, shard):
                raise TapsError(f"feature cache shard {self.directory / shard['file']} is missing or truncated; {self.rebuild_hint}")
        self._starts = [s["start"] for s in self.shards]
        self._open: dict[int, tuple] = {}

    @property
    def rebuild_hint(self) -> str:
        return f"delete {self.directory} and rebuild it with `taps-train cache --recipe <recipe>`"

    def __len__(self) -> int:
        return self.manifest["samples"]

    def length(self, position: int) -> int:
        shard, local = self._locate(position)
        offsets = self._handles(shard)[1]
        return int(offsets[local + 1] - offsets[local])

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        shard, local = self._locate(position)
        handle, offsets = self._handles(shard)
        a, b = int(offsets[local]), int(offsets[local + 1])
        sample = {"input_ids": handle.get_slice("input_ids")[a:b].long(), "loss_mask": handle.get_slice("loss_mask")[a:b].bool()}
        for name in (FEATURES, TARGETS):
            if name in handle.keys():
                values = handle.get_slice(name)[a:b]
                if _scales_key(name) in handle.keys():
                    values = values.float() * handle.get_slice(_scales_key(name))[a:b][:, None]
                sample[name] = values.float()
        return sample

    def tokens(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids (int64) and loss_mask (bool) of one sample, without reading its features."""
        shard, local = self._locate(position)
        handle, offsets = self._handles(shard)
        a, b = int(offsets[local]), int(offsets[local + 1])
        return handle.get_slice("input_ids")[a:b].long(), handle.get_slice("loss_mask")[a:b].bool()

    def token_counts(self, samples: int) -> tuple[int, int]:
        """(tokens, tokens in the loss) of the first `samples` positions, from the shards' offsets and loss
        masks; not checksummed (they only feed a report), and no shard is read beyond the mask bytes."""
        tokens = in_loss = 0
        for shard in self.shards:
            if shard["start"] >= samples:
                break
            with safe_open(str(self.directory / shard["file"]), framework="pt") as handle:
                end = int(handle.get_tensor("offsets")[min(samples, shard["end"]) - shard["start"]])
                tokens += end
                in_loss += int(handle.get_slice("loss_mask")[:end].sum())
        return tokens, in_loss

    def verify(self) -> None:
        """Check every shard's checksum now (normally done lazily on first open)."""
        for index in range(len(self.shards)):
            self._handles(index)

    def _locate(self, position: int) -> tuple[int, int]:
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} outside cache of {len(self)} samples at {self.directory}")
        shard = bisect.bisect_right(self._starts, position) - 1
        return shard, position - self.shards[shard]["start"]

    def _handles(self, shard: int):
        if shard not in self._open:
            record = self.shards[shard]
            path = self.directory / record["file"]
            if file_sha256(path) != record["sha256"]:
                raise TapsError(f"feature cache shard {path} fails its checksum (corrupt); {self.rebuild_hint}")
            handle = safe_open(str(path), framework="pt")
            self._open[shard] = (handle, handle.get_tensor("offsets"))
        return self._open[shard]

    def __getstate__(self):  # DataLoader workers reopen shards themselves
        return {**self.__dict__, "_open": {}}


def _shard_intact_size(directory: Path, shard: dict) -> bool:
    path = directory / shard["file"]
    return path.is_file() and path.stat().st_size == shard["bytes"]


def _read_manifest(directory: Path) -> dict | None:
    path = directory / "manifest.json"
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, RecursionError) as err:
        raise TapsError(f"feature cache manifest {path} is corrupt ({err}); delete {directory} and rebuild") from err
    problem = _manifest_problem(manifest)
    if problem:
        raise TapsError(f"feature cache manifest {path} is damaged ({problem}); delete {directory} and rebuild")
    return manifest


_SHARD_FILE = re.compile(r"^shard-\d{5}(?:-(?P<end>\d+))?\.safetensors$")


def _manifest_problem(manifest: object) -> str | None:
    """What is wrong with a manifest's shape, or None: readers index shards by these fields, and a shard
    `file` is a bare name (never a path out of the cache directory)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("fingerprint"), dict):
        return "not a mapping with a fingerprint"
    shards, samples = manifest.get("shards"), manifest.get("samples")
    if not isinstance(shards, list) or not _is_count(samples):
        return "'shards' must be a list and 'samples' a count"
    covered = 0
    for index, shard in enumerate(shards):
        if not isinstance(shard, dict) or not isinstance(shard.get("file"), str) or not _SHARD_FILE.match(shard["file"]):
            return f"shard {index} has no valid file name"
        if not all(_is_count(shard.get(key)) for key in ("start", "end", "bytes", "tokens")) or not isinstance(shard.get("sha256"), str):
            return f"shard {index} ({shard['file']}) lacks start/end/bytes/tokens/sha256"
        if shard["start"] != covered or shard["end"] <= shard["start"]:
            return f"shard {index} ({shard['file']}) covers {shard['start']}:{shard['end']}, expected to start at {covered}"
        covered = shard["end"]
    if covered < samples:
        return f"shards cover {covered} samples, the manifest claims {samples}"
    return None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _matching_manifest(directory: Path, fingerprint: dict) -> dict | None:
    """The directory's manifest, None if it has none; refuses a cache built for another setup."""
    manifest = _read_manifest(directory)
    if manifest is not None and manifest["fingerprint"] != fingerprint:
        raise TapsError(_mismatch(directory, manifest["fingerprint"], fingerprint))
    return manifest


def manifest_samples(directory: Path, fingerprint: dict) -> int:
    """Samples the last finished build of `directory` cached (0 if none finished), its shards unchecked: a larger
    build of the same source, killed after replacing that build's last shard with a longer one, leaves the smaller
    build's manifest behind, and must then resume from its own shards, not be refused for the replaced one."""
    manifest = _matching_manifest(directory, fingerprint)
    return 0 if manifest is None else manifest["samples"]


def _listed_shards(directory: Path, fingerprint: dict) -> dict[tuple[int, int], dict]:
    """Intact shards the manifest lists, by span; refuses a cache built for another setup."""
    manifest = _matching_manifest(directory, fingerprint)
    if manifest is None:
        return {}
    return {(s["start"], s["end"]): s for s in manifest["shards"] if _shard_intact_size(directory, s)}


def _write_manifest(directory: Path, manifest: dict) -> None:
    with _fresh_file(directory, "manifest.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _mismatch(directory: Path, found: dict, expected: dict) -> str:
    fields = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
    return (
        f"feature cache {directory} was built for a different setup (differs in: {', '.join(fields)}); "
        f"refusing to use it. Delete it or point cache_dir elsewhere to rebuild"
    )


def _check_disk(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise TapsError(
            f"feature cache at {directory} needs ~{size(needed)} but only {size(free)} are free; "
            "free space, choose another cache_dir, or use fp8 / online mode"
        )
