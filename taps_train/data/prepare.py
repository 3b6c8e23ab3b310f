"""Recipe -> per-source token samples -> feature caches: the work behind `taps-train cache` and the
datamodule, on one process or split by shard over several ranks.

Everything that can fail on bad input (recipe fields, unknown sources, missing files, counts larger
than a source) is checked by `select` before the verifier runs.
"""

import hashlib
import json
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from taps_train.data.chat_format import MASK_RULE, TokenizedSample, tokenize_conversation
from taps_train.data.conversation import Conversation
from taps_train.data.distributed import Ranks, wait_until_visible
from taps_train.data.feature_cache import (
    FORMAT,
    CacheSettings,
    FeatureCache,
    ShardWriter,
    Throughput,
    bytes_per_token,
    manifest_samples,
    measure_throughput,
    pending_tokens,
    remove_stale_temporaries,
    shard_ranges,
    write_manifest,
)
from taps_train.files import exclusive
from taps_train.data.recipe import Recipe, SelectedSource, select
from taps_train.features import EAGLE_FEATURES, FeatureContract, check_layers
from taps_train.errors import TapsError
from taps_train.home import taps_home
from taps_train.data.vllm_generation import ENGINE_PYTHON_VARIABLE, EngineUnavailable, VllmGenerator, find_engine_python
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import files_stop_token_ids
from taps_train.verifier.loading import (
    LoadedVerifier,
    load_verifier,
    read_verifier_files,
)
from taps_train.verifier.placement import resolve_placement


@dataclass
class PreparedSource:
    """One source of a recipe: its samples by position (held-out first, then training) and its cache."""

    name: str
    selected: SelectedSource
    conversations: list[Conversation]
    tokenizer: PreTrainedTokenizerBase
    max_length: int
    directory: Path
    fingerprint: dict

    @cached_property
    def samples(self) -> list[TokenizedSample]:
        """Tokenized on first use: reading an existing cache does not need it."""
        return tokenize_all(self.tokenizer, self.conversations, self.max_length, self.name)

    @property
    def heldout_positions(self) -> range:
        return range(0, self.selected.selection.heldout)

    @property
    def train_positions(self) -> range:
        heldout = self.selected.selection.heldout
        return range(heldout, heldout + self.selected.selection.count)

    def open_cache(self) -> FeatureCache:
        return FeatureCache(self.directory, self.fingerprint)

    def complete(self) -> bool:
        """Whether the cache holds every sample (it may hold more, for a larger recipe); its shards are checked when
        it is opened."""
        return manifest_samples(self.directory, self.fingerprint) >= len(self.conversations)

    def token_counts(self) -> tuple[int, int]:
        """(tokens, tokens in the loss). A complete cache has them without tokenizing: its fingerprint covers the
        source's content and selection, max_length, the tokenizer and FORMAT, so its stored tokens are exactly
        what tokenizing the conversations again would give."""
        if self.complete():
            return self.open_cache().token_counts(len(self.conversations))
        return sum(len(s.input_ids) for s in self.samples), sum(sum(s.loss_mask) for s in self.samples)

    def pending_tokens(self, settings: CacheSettings) -> int:
        """Tokens the verifier must still run: none for a complete cache; else those of the shards not on disk,
        less the batches that killed builds saved."""
        if self.complete():
            return 0
        return pending_tokens(self.samples, self.directory, self.fingerprint, shard_ranges(len(self.conversations), settings.shard_samples), settings)


GENERATION_ENGINES = ("auto", "transformers", "vllm")

ShardsByRank = list[list[list[dict] | None]]  # [rank][source]: the shard records that rank holds (None: source already cached)


def default_cache_root() -> Path:
    return taps_home() / "features"


class RecipePreparer:
    """Loads the verifier lazily: dry runs and fully cached recipes never run it.

    `device` / `verifier_dtype` say where and in which precision the verifier computes features and
    regenerated replies; the compute dtype is part of the cache fingerprint (bf16 and fp32 features
    differ), the storage dtype is `settings.dtype`. `contract` says which hidden states the drafter
    backbone reads (and is part of the fingerprint too). `generation_engine` says what generates regenerated replies:
    `transformers` (the loaded verifier's `generate`), `vllm` (a vLLM worker run by `engine_python`, else
    $TAPS_ENGINE_PYTHON, else this python), or `auto`: vLLM where one is found and serves the verifier, else
    transformers.
    """

    def __init__(self, recipe: Recipe, verifier: str, cache_root: Path | None = None, settings: CacheSettings = CacheSettings(),
                 device: str = "auto", verifier_dtype: str = "auto", contract: FeatureContract = EAGLE_FEATURES,
                 generation_engine: str = "auto", engine_python: str | None = None):
        if generation_engine not in GENERATION_ENGINES:
            raise TapsError(f"unknown generation engine {generation_engine!r}; use one of {', '.join(GENERATION_ENGINES)}")
        self.generation_engine, self.engine_python = generation_engine, engine_python
        self.recipe = recipe
        self.verifier_name = verifier
        self.cache_root = Path(cache_root) if cache_root else default_cache_root()
        self.settings = settings
        self.placement = resolve_placement(device, verifier_dtype)
        self.selected = [select(selection, recipe.seed) for selection in recipe.sources]
        files = read_verifier_files(verifier)  # the guarded loader `eval` and `fit` use: damaged files are one-line errors
        self.path = files.path
        self.tokenizer: PreTrainedTokenizerBase = files.tokenizer
        config = files.config
        self.hidden_size = config.hidden_size
        self.contract = contract
        check_layers(contract, config, verifier)
        context = getattr(config, "max_position_embeddings", None)
        if isinstance(context, int) and recipe.max_length > context:  # positions the verifier never trained on
            raise TapsError(f"recipe {recipe.name} has max_length {recipe.max_length} but verifier {verifier} has a context of "
                            f"{context} tokens (max_position_embeddings); set max_length <= {context} in the recipe")
        self.fingerprint = verifier_fingerprint(self.path, self.tokenizer)
        self.stop_token_ids = files_stop_token_ids(files)
        self._verifier: LoadedVerifier | None = None

    @property
    def verifier(self) -> LoadedVerifier:
        if self._verifier is None:
            self._verifier = load_verifier(self.verifier_name, self.placement.device, self.placement.dtype_name)
        return self._verifier

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    def release_verifier(self) -> None:
        """Drop the verifier once the caches are written: training never uses this copy, and it holds a GPU's
        worth of memory for an 8B verifier."""
        self._verifier = None

    def sources(self, regenerate: bool = True) -> list[PreparedSource]:
        """Tokenized samples and cache locations; regenerates replies first where the recipe asks."""
        prepared = []
        for index, selected in enumerate(self.selected):
            conversations = selected.heldout + selected.train
            if selected.selection.regenerate is not None and regenerate:
                conversations = self._regenerated(selected, conversations)
            fingerprint = {
                "format": FORMAT,
                "verifier": self.fingerprint,
                "source": selected.key,
                "max_length": self.recipe.max_length,
                "loss_mask_rule": MASK_RULE,
                "dtype": self.settings.dtype,
                "compute_dtype": self.placement.dtype_name,
                "feature": self.contract.fingerprint(),
                "regenerated": asdict(selected.selection.regenerate) if selected.selection.regenerate else None,
            }
            digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
            prepared.append(
                PreparedSource(
                    name=f"{selected.selection.source}[{index}]",
                    selected=selected,
                    conversations=conversations,
                    tokenizer=self.tokenizer,
                    max_length=self.recipe.max_length,
                    directory=self.cache_root / digest,
                    fingerprint=fingerprint,
                )
            )
        return prepared

    def build(self, sources: list[PreparedSource], ranks: Ranks = Ranks()) -> list[FeatureCache]:
        """Fill the missing shards of every source's cache, write each manifest once all its shards exist, open the caches.

        With several ranks, shard g of the recipe (counting every source's shards in order) is built by rank
        g % world: a split each rank computes alone, whatever is on disk. The ranks then swap their shard
        records (a few hundred bytes each), rank 0 writes the manifests once it sees every shard, and every
        rank checks it sees them all: a cache dir that is not shared by all nodes is refused here.

        Another build of the same caches (a second `cache` or `fit`) waits for this one and then finds the
        shards done: rank 0 alone locks the cache dirs, before any rank fills, and releases them once the
        manifests are written; the other ranks wait for it in `agree`, so the ranks of one build never wait
        for each other's locks.
        """
        owned = self._owned_spans(sources, ranks)
        with ExitStack() as locks:
            ranks.agree(lambda: self._lock(sources, locks) if ranks.rank == 0 else None)
            mine = ranks.agree(lambda: self._fill(sources, owned, ranks))
            shards = ranks.gather(mine)
            ranks.agree(lambda: self._write_manifests(sources, shards, ranks.rank))
        ranks.agree(lambda: wait_until_visible(_expected_files(sources, shards, manifests=True), ranks.rank))
        return [source.open_cache() for source in sources]

    @staticmethod
    def _lock(sources: list[PreparedSource], locks: ExitStack) -> None:
        """Lock the dir of every source not yet cached, in sorted order (two builds of overlapping recipes then
        never each hold a lock the other waits for), and remove what killed builds left there."""
        for directory in sorted({source.directory for source in sources if not source.complete()}):
            locks.enter_context(exclusive(directory / ".lock", f"another build of {directory}"))
            files, freed = remove_stale_temporaries(directory)
            if files:
                print(f"removed {files} temporary files ({freed / 1e6:,.1f} MB) that killed builds left in {directory}", file=sys.stderr, flush=True)

    def _owned_spans(self, sources: list[PreparedSource], ranks: Ranks) -> list[list[tuple[int, int]]]:
        owned, first = [], 0
        for source in sources:
            spans = shard_ranges(len(source.conversations), self.settings.shard_samples)
            owned.append([span for index, span in enumerate(spans, first) if ranks.owns(index)])
            first += len(spans)
        return owned

    def _fill(self, sources: list[PreparedSource], owned: list[list[tuple[int, int]]], ranks: Ranks) -> list[list[dict] | None]:
        """This rank's shard records per source; None for a source whose cache already holds enough samples
        (it may hold more, for a larger recipe, in shards of other spans: it is left as it is)."""
        writer = ShardWriter(lambda: self.verifier.model, self.contract, self.hidden_size, self.settings, self.pad_id, ranks.label)
        records = []
        for source, spans in zip(sources, owned):
            records.append(None if source.complete() else writer.fill(source.samples, source.directory, source.fingerprint, spans))
        if ranks.world > 1:
            held = sum(len(r) for r in records if r is not None)
            print(f"{ranks.label}{held} shards on disk; waiting for the other ranks", file=sys.stderr, flush=True)
        return records

    def _write_manifests(self, sources: list[PreparedSource], shards: ShardsByRank, rank: int) -> None:
        """Rank 0, once it sees every shard: the manifest of each source it found incomplete."""
        if rank != 0:
            return
        wait_until_visible(_expected_files(sources, shards, manifests=False), rank)
        for index, source in enumerate(sources):
            if shards[0][index] is None:
                continue
            records = sorted((r for per_rank in shards for r in per_rank[index] or []), key=lambda r: r["start"])
            if [(r["start"], r["end"]) for r in records] != shard_ranges(len(source.conversations), self.settings.shard_samples):
                raise TapsError(f"the ranks disagree about which shards of {source.directory} exist (is another build writing it?); "
                                "the feature cache dir must be one directory on a filesystem shared by all nodes")
            report = {"source": source.selected.report.summary(), "duplicates_dropped": source.selected.duplicates}
            write_manifest(source.directory, source.fingerprint, records, len(source.conversations), report)

    def estimate(self, sources: list[PreparedSource]) -> list[dict]:
        """Per source: samples, tokens, tokens in the loss, tokens the verifier must still run and the bytes they add
        (0 when already cached); tokenizes only the sources whose cache is incomplete."""
        rows = []
        for source in sources:
            tokens, in_loss = source.token_counts()
            pending = source.pending_tokens(self.settings)
            rows.append({
                "source": source.name,
                "samples": len(source.conversations),
                "tokens": tokens,
                "assistant_tokens": in_loss,
                "pending_tokens": pending,
                "new_bytes": pending * bytes_per_token(self.contract.widths(self.hidden_size).values(), self.settings.dtype),
                "cache": str(source.directory),
            })
        return rows

    def measure(self, source: PreparedSource) -> Throughput:
        """The verifier's feature throughput on a batch of the source's first shard, as a build computes it (loads the verifier)."""
        return measure_throughput(self.verifier.model, self.contract, source.samples[: self.settings.shard_samples], self.pad_id, self.settings)

    def _regenerated(self, selected: SelectedSource, conversations: list[Conversation]) -> list[Conversation]:
        """The source's conversations with the verifier's own replies, from the first engine of `_engine_pythons` that
        starts (each engine's replies are a file of their own: engines sample differently)."""
        *fallbacks, last = self._engine_pythons()
        for python in fallbacks:
            try:
                return self._regenerated_by(python, selected, conversations)
            except EngineUnavailable as err:
                print(f"regeneration: {err}; regenerating with transformers instead", file=sys.stderr, flush=True)
        return self._regenerated_by(last, selected, conversations)

    def _engine_pythons(self) -> list[str | None]:
        """The engines to try, in order: the python of a vLLM worker, or None for transformers."""
        python = find_engine_python(self.engine_python) if self.generation_engine != "transformers" else None
        if self.generation_engine == "vllm" and python is None:
            raise TapsError("generation engine vllm: no python with vLLM found; pass engine_python (a venv from scripts/vllm-venv.sh), "
                            f"set ${ENGINE_PYTHON_VARIABLE}, or use generation engine transformers")
        vllm = [python] if python else []
        return vllm if self.generation_engine == "vllm" else vllm + [None]

    def _regenerated_by(self, python: str | None, selected: SelectedSource, conversations: list[Conversation]) -> list[Conversation]:
        from taps_train.data.regenerate import regenerate, transformers_generator

        spec = selected.selection.regenerate
        # Greedy replies are the verifier's whichever engine computed them (SmolLM2's fp32 replies through vLLM and
        # transformers are identical, tests/data/test_regenerate_engines.py): a greedy regeneration without a file of its
        # own starts from the other engine's, so replies regenerated once are not regenerated again without that engine.
        other = (self._regenerated_file(selected, python is None), "transformers" if python else "vLLM") if spec.temperature == 0 else None
        if python is None:
            start = lambda: transformers_generator(self.verifier.model, self.verifier.tokenizer)()  # noqa: E731
        else:
            start = lambda: VllmGenerator(python, self.path, self.placement.dtype_name, self.recipe.max_length)  # noqa: E731
        return regenerate(conversations, start, self.tokenizer, self.stop_token_ids, spec, self.recipe.max_length,
                          self._regenerated_file(selected, python is not None), VllmGenerator.chunk if python else None, other)

    def _regenerated_file(self, selected: SelectedSource, vllm: bool) -> Path:
        """Where one engine's replies for the source live (transformers' files keep the key they had before engines were
        a choice)."""
        parts = [self.fingerprint, selected.key, asdict(selected.selection.regenerate), self.recipe.max_length,
                 self.placement.dtype_name] + (["vllm"] if vllm else [])
        return self.cache_root / "regenerated" / f"{hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]}.jsonl"


def _expected_files(sources: list[PreparedSource], shards: ShardsByRank, manifests: bool) -> list[tuple[Path, int | None, int]]:
    """(path, size, rank that has it) of every shard the ranks reported, and of each manifest (rank 0's)."""
    files = [(source.directory / "manifest.json", None, 0) for source in sources] if manifests else []
    for rank, per_rank in enumerate(shards):
        for source, records in zip(sources, per_rank):
            files += [(source.directory / r["file"], r["bytes"], rank) for r in records or []]
    return files


def tokenize_all(tokenizer: PreTrainedTokenizerBase, conversations: list[Conversation], max_length: int, label: str) -> list[TokenizedSample]:
    return [
        tokenize_conversation(tokenizer, conversation, max_length)
        for conversation in tqdm(conversations, desc=f"tokenizing {label}", unit="conv", leave=False)
    ]
