"""Recipe -> per-source token samples -> feature caches: the work behind `taps-train cache` and the
datamodule's `prepare_data`.

Everything that can fail on bad input (recipe fields, unknown sources, missing files, counts larger
than a source) is checked by `select` before the verifier runs.
"""

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from taps_train.data.chat_format import TokenizedSample, tokenize_conversation
from taps_train.data.conversation import Conversation
from taps_train.data.feature_cache import (
    FEATURE_KIND,
    FORMAT,
    CacheSettings,
    FeatureCache,
    build_cache,
    bytes_per_token,
)
from taps_train.data.recipe import Recipe, SelectedSource, select
from taps_train.home import taps_home
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import (
    LoadedVerifier,
    load_verifier,
    resolve_verifier_path,
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

    def cached_samples(self) -> int:
        if not (self.directory / "manifest.json").exists():
            return 0
        return len(FeatureCache(self.directory, self.fingerprint))


def default_cache_root() -> Path:
    return taps_home() / "features"


class RecipePreparer:
    """Loads the verifier lazily: dry runs and fully cached recipes never run it.

    `device` / `verifier_dtype` say where and in which precision the verifier computes features and
    regenerated replies; the compute dtype is part of the cache fingerprint (bf16 and fp32 features
    differ), the storage dtype is `settings.dtype`.
    """

    def __init__(self, recipe: Recipe, verifier: str, cache_root: Path | None = None, settings: CacheSettings = CacheSettings(),
                 device: str = "auto", verifier_dtype: str = "auto"):
        self.recipe = recipe
        self.verifier_name = verifier
        self.cache_root = Path(cache_root) if cache_root else default_cache_root()
        self.settings = settings
        self.placement = resolve_placement(device, verifier_dtype)
        self.selected = [select(selection, recipe.seed) for selection in recipe.sources]
        self.path = resolve_verifier_path(verifier)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.path, trust_remote_code=False)
        self.hidden_size = AutoConfig.from_pretrained(self.path, trust_remote_code=False).hidden_size
        self.fingerprint = verifier_fingerprint(self.path, self.tokenizer)
        self._verifier: LoadedVerifier | None = None

    @property
    def verifier(self) -> LoadedVerifier:
        if self._verifier is None:
            self._verifier = load_verifier(self.verifier_name, self.placement.device, self.placement.dtype_name)
        return self._verifier

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
                "dtype": self.settings.dtype,
                "compute_dtype": self.placement.dtype_name,
                "feature": FEATURE_KIND,
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

    def build(self, sources: list[PreparedSource]) -> list[FeatureCache]:
        caches = []
        for source in sources:
            if source.cached_samples() >= len(source.conversations):
                caches.append(source.open_cache())
                continue
            report = {"source": source.selected.report.summary(), "duplicates_dropped": source.selected.duplicates}
            caches.append(
                build_cache(self.verifier.model, source.samples, source.directory, source.fingerprint, self.settings, self.tokenizer.pad_token_id or 0, report)
            )
        return caches

    def estimate(self, sources: list[PreparedSource]) -> list[dict]:
        """Per source: tokens, bytes a build would add (0 when already cached), bytes per token."""
        rows = []
        for source in sources:
            tokens = sum(len(s.input_ids) for s in source.samples)
            have = source.cached_samples()
            missing = sum(len(s.input_ids) for s in source.samples[have:])
            rows.append({
                "source": source.name,
                "samples": len(source.samples),
                "tokens": tokens,
                "assistant_tokens": sum(sum(s.loss_mask) for s in source.samples),
                "new_bytes": missing * bytes_per_token(self.hidden_size, self.settings.dtype),
                "cache": str(source.directory),
            })
        return rows

    def _regenerated(self, selected: SelectedSource, conversations: list[Conversation]) -> list[Conversation]:
        from taps_train.data.regenerate import regenerate

        spec = selected.selection.regenerate
        key = hashlib.sha256(json.dumps([self.fingerprint, selected.key, asdict(spec), self.recipe.max_length, self.placement.dtype_name],
                                        sort_keys=True).encode()).hexdigest()[:16]
        verifier = self.verifier
        return regenerate(conversations, verifier.model, verifier.tokenizer, spec, self.recipe.max_length, self.cache_root / "regenerated" / f"{key}.jsonl")


def tokenize_all(tokenizer: PreTrainedTokenizerBase, conversations: list[Conversation], max_length: int, label: str) -> list[TokenizedSample]:
    return [
        tokenize_conversation(tokenizer, conversation, max_length)
        for conversation in tqdm(conversations, desc=f"tokenizing {label}", unit="conv", leave=False)
    ]
