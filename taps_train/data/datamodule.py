"""`DrafterDataModule`: recipe -> (cached or online) samples -> length-bucketed batches.

Offline mode (default) reads verifier features from the feature cache, built on first use: in
`prepare_data` by a single process, in `setup` by every rank of a multi-rank job, each its share of
the shards (`prepare_data` runs on one process per node and would leave the other GPUs idle for the
whole build). Online mode stores nothing: batches carry tokens only and the training step runs the
frozen verifier, for recipes whose caches would not fit on disk. Validation uses the recipe's
held-out samples, which training never sees.
"""

import shlex

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from taps_train.data.batching import BucketBatchSampler, pad_collate
from taps_train.data.chat_format import TokenizedSample
from taps_train.data.distributed import (
    CacheNotShared,
    Ranks,
    build_ranks,
    pinned_device,
    several_ranks,
)
from taps_train.data.feature_cache import CacheSettings, FeatureCache
from taps_train.data.prepare import GENERATION_ENGINES, PreparedSource, RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.features import LAST, FeatureContract
from taps_train.errors import TapsError
from taps_train.paths import writable_directory
from taps_train.ranges import int_problem, require
from taps_train.verifier.placement import resolve_placement
from taps_train.verifier.loading import DEFAULT_VERIFIER


TRAIN_ON = ("assistant", "all")


class CachedSamples(Dataset):
    """Some positions of one feature cache: mixtures and splits are views, not copies."""

    def __init__(self, cache: FeatureCache, positions: list[int]):
        self.cache, self.positions = cache, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.cache[self.positions[index]]

    def lengths(self) -> list[int]:
        return [self.cache.length(p) for p in self.positions]

    def loss_token_counts(self, vocab_size: int) -> torch.Tensor:
        return sum(_loss_token_counts(*self.cache.tokens(p), vocab_size) for p in self.positions)


class EveryTokenInLoss(Dataset):
    """Training samples whose every token is in the loss (`train_on: all`), not only the assistant's: the cache holds
    the verifier's features, and so its distribution, at the user and system tokens too, so the drafter learns from
    them without another verifier pass. Token counts, which a draft vocabulary is chosen from, stay the assistant's."""

    def __init__(self, samples: "CachedSamples | TokenSamples"):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.samples[index]
        return {**item, "loss_mask": torch.ones_like(item["loss_mask"])}

    def lengths(self) -> list[int]:
        return self.samples.lengths()

    def loss_token_counts(self, vocab_size: int) -> torch.Tensor:
        return self.samples.loss_token_counts(vocab_size)


class TokenSamples(Dataset):
    """Tokens and loss masks only (online mode): features come from the verifier in the training step."""

    def __init__(self, samples: list[TokenizedSample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index]
        return {"input_ids": torch.tensor(sample.input_ids), "loss_mask": torch.tensor(sample.loss_mask, dtype=torch.bool)}

    def lengths(self) -> list[int]:
        return [len(s.input_ids) for s in self.samples]

    def loss_token_counts(self, vocab_size: int) -> torch.Tensor:
        return sum(_loss_token_counts(torch.tensor(s.input_ids), torch.tensor(s.loss_mask, dtype=torch.bool), vocab_size) for s in self.samples)


class DrafterDataModule(LightningDataModule):
    def __init__(
        self,
        recipe: str,
        verifier: str = DEFAULT_VERIFIER,
        cache_dir: str | None = None,
        feature_dtype: str = "bfloat16",
        verifier_device: str = "auto",
        verifier_dtype: str = "auto",
        online: bool = False,
        batch_size: int = 8,
        max_tokens_per_batch: int | None = None,
        val_samples_per_source: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        verifier_states: tuple[int, ...] = (LAST,),
        generation_engine: str = "auto",
        engine_python: str | None = None,
        train_on: str = "assistant",
    ):
        """
        Args:
            recipe: data recipe YAML (data_recipes/*.yaml).
            verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local HF model directory, or a hub id; must match the drafter's.
            cache_dir: feature cache root (default $TAPS_HOME/features).
            feature_dtype: cache storage dtype, bfloat16 or fp8_e4m3.
            verifier_device: where the verifier computes missing cache features: auto (the current CUDA
                device, else CPU), cpu, cuda, cuda:N, or auto-shard (layers spread over all visible GPUs).
            verifier_dtype: the verifier's compute dtype for the cache: auto (bfloat16 on CUDA, float32 on
                CPU), bfloat16, float16 or float32. Part of the cache fingerprint.
            online: compute features in the training step instead of caching them.
            batch_size: maximum conversations per batch.
            max_tokens_per_batch: also cap padded tokens per batch (None: no cap).
            val_samples_per_source: validate on at most this many held-out samples per source (None: all).
            num_workers: DataLoader worker processes.
            seed: shuffling seed (per epoch: seed + epoch).
            verifier_states: the verifier hidden states the drafter reads (its feature contract; -1 = the post-norm
                last state). `taps-train fit` sets it from the model's drafter backbone.
            generation_engine: what generates the replies of the recipe's `regenerate:` sources: transformers (the
                verifier's `generate`), vllm, or auto: vLLM where `engine_python`, $TAPS_ENGINE_PYTHON or this python
                has it and it serves the verifier, else transformers. vLLM is ~3x faster on a CPU (same greedy replies
                in fp32); each engine's replies are cached apart.
            engine_python: a python that imports vllm (e.g. a venv from scripts/vllm-venv.sh).
            train_on: the tokens whose guesses train the drafter: assistant (the replies it drafts, as EAGLE and its
                successors train) or all (user and system turns too, whose features the cache holds anyway: more
                positions from the same conversations at no verifier cost). Validation stays on assistant tokens.
                Measured on SmolLM2 chat (EAGLE-2, docs/results/learning_curves/smol_eagle2_chat): a little more τ per
                step, none per minute of training (each step costs ~2.3x), so assistant is the default.
        """
        super().__init__()
        # The verifier's placement for the cache is logged under its own names: the module's verifier_device/verifier_dtype
        # may differ (a cache built in bfloat16, training in float32), and Lightning refuses two values under one key.
        self.save_hyperparameters(ignore=["verifier_device", "verifier_dtype"])
        self.save_hyperparameters({**self.hparams, "cache_verifier_device": verifier_device, "cache_verifier_dtype": verifier_dtype})
        for name, problem in {
            "data.batch_size": int_problem(batch_size, 1, "at least 1 conversation per batch"),
            "data.max_tokens_per_batch": None if max_tokens_per_batch is None else int_problem(max_tokens_per_batch, 1, "a token cap (or null)"),
            "data.val_samples_per_source": None if val_samples_per_source is None else int_problem(val_samples_per_source, 0, "a count (or null: all)"),
            "data.num_workers": int_problem(num_workers, 0, "a worker count"),
            "data.seed": int_problem(seed, 0, "a seed"),
        }.items():
            require(name, problem)
        self.recipe_path = recipe
        self.recipe = load_recipe(recipe)
        if max_tokens_per_batch is not None and max_tokens_per_batch < self.recipe.max_length:
            raise TapsError(f"data.max_tokens_per_batch {max_tokens_per_batch} is smaller than one sample of recipe {recipe} (max_length "
                            f"{self.recipe.max_length}): such a sample would make a batch over the cap; pass at least {self.recipe.max_length}")
        self.verifier = verifier
        self.settings = CacheSettings(dtype=feature_dtype)
        self.contract = FeatureContract(tuple(verifier_states))
        resolve_placement(verifier_device, verifier_dtype)  # refuse a bad device/dtype now, not after the data is read
        self.verifier_device = verifier_device
        self.verifier_dtype = verifier_dtype
        if generation_engine not in GENERATION_ENGINES:
            raise TapsError(f"unknown data.generation_engine {generation_engine!r}; use one of {', '.join(GENERATION_ENGINES)}")
        self.generation_engine, self.engine_python = generation_engine, engine_python
        if train_on not in TRAIN_ON:
            raise TapsError(f"unknown data.train_on {train_on!r}; use one of {', '.join(TRAIN_ON)}")
        self.train_on = train_on
        self.cache_dir = writable_directory(cache_dir, "data.cache_dir", "pass a writable folder for the feature cache") if cache_dir else None
        self.online = online
        self.batch_size = batch_size
        self.max_tokens = max_tokens_per_batch
        self.val_limit = val_samples_per_source
        self.num_workers = num_workers
        self.seed = seed
        self.train_set: ConcatDataset | None = None
        self.val_set: ConcatDataset | None = None
        self._recipe_preparer: RecipePreparer | None = None

    def _preparer(self) -> RecipePreparer:
        """One per process: loading the sources and hashing their files is not free (125 MB for ShareGPT)."""
        if self._recipe_preparer is None:
            self._recipe_preparer = RecipePreparer(self.recipe, self.verifier, self.cache_dir, self.settings,
                                                  self.verifier_device, self.verifier_dtype, self.contract,
                                                  self.generation_engine, self.engine_python)
        return self._recipe_preparer

    def prepare_data(self) -> None:
        """One process: build missing feature caches (before `setup`); a no-op when cached. Several ranks:
        `setup` builds instead, every rank its share (Lightning runs this on one process per node)."""
        if not self.online and not several_ranks():
            preparer = self._preparer()
            preparer.build(preparer.sources())

    def setup(self, stage: str | None = None) -> None:
        sources = self._shared_sources() if several_ranks() else self._preparer().sources()
        self._preparer().release_verifier()  # it built the cache or regenerated replies; training never uses this copy
        train, val = [], []
        for source in sources:
            heldout = list(source.heldout_positions)[: self.val_limit]
            view = self._view(source, list(source.train_positions))
            train.append(EveryTokenInLoss(view) if self.train_on == "all" else view)
            val.append(self._view(source, heldout))
        self.train_set = ConcatDataset([d for d in train if len(d)])
        self.val_set = ConcatDataset([d for d in val if len(d)]) if any(len(d) for d in val) else None

    def _shared_sources(self) -> list[PreparedSource]:
        """Several ranks: rank 0 regenerates replies first (one file per source), then every rank builds its
        share of the missing shards. Ranks wait for each other on a gloo group sized for the build, never on
        the job's own collectives, whose timeout a long build would exceed."""
        preparer = self._preparer()
        if not self.online:
            self._refuse_pinned_build(preparer)
        with build_ranks() as ranks:
            sources = ranks.rank_zero_first(preparer.sources)
            if not self.online:
                try:
                    preparer.build(sources, ranks)
                except CacheNotShared as err:
                    command = self.cache_command(self._processes_per_node(ranks))
                    raise TapsError(f"{err} (or build the cache before fit with `{command}` and copy it to every node)") from err
        return sources

    def _refuse_pinned_build(self, preparer: RecipePreparer) -> None:
        if pinned_device(self.verifier_device) and not all(s.complete() for s in preparer.sources(regenerate=False)):
            raise TapsError(f"verifier_device {self.verifier_device} puts every rank's verifier on the same GPU(s), so the ranks cannot build "
                            f"the feature cache together; build it first with `{self.cache_command(1)}`, or use verifier_device auto "
                            "(each rank on its own GPU)")

    def _processes_per_node(self, ranks: Ranks) -> int:
        return self.trainer.num_devices if self.trainer is not None else ranks.world

    def cache_command(self, processes: int) -> str:
        """The `taps-train cache` call that builds this datamodule's feature caches ahead of `fit`."""
        options = {"--recipe": self.recipe_path, "--verifier": self.verifier, "--cache-dir": self.cache_dir,
                   "--device": self.verifier_device, "--verifier-dtype": self.verifier_dtype, "--dtype": self.settings.dtype}
        defaults = {"--device": "auto", "--verifier-dtype": "auto", "--dtype": "bfloat16"}
        given = [f"{name} {shlex.quote(str(value))}" for name, value in options.items() if value is not None and value != defaults.get(name)]
        return f"torchrun --nproc_per_node {processes} -m taps_train cache {' '.join(given)}"

    def _view(self, source: PreparedSource, positions: list[int]) -> Dataset:
        if self.online:
            return TokenSamples([source.samples[p] for p in positions])
        return CachedSamples(source.open_cache(), positions)

    def train_dataloader(self) -> DataLoader:
        skip = 0
        trainer = self.trainer
        if trainer is not None and trainer.fit_loop.restarting:
            # Resuming mid-epoch: skip what the checkpointed run already trained on (exact data order).
            skip = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        sampler = BucketBatchSampler(_lengths(self.train_set), self.batch_size, self.max_tokens, shuffle=True, seed=self.seed, skip_batches=skip)
        return self._loader(self.train_set, sampler, ResumingLoader)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return self._loader(self.val_set, BucketBatchSampler(_lengths(self.val_set), self.batch_size, self.max_tokens, shuffle=False))

    def loss_token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs in the loss (assistant tokens) of the training set: [vocab_size] int64,
        what an EAGLE-3 draft vocabulary is chosen from."""
        if self.train_set is None:
            raise TapsError("the datamodule has no training set yet (call setup('fit') first)")
        return assistant_token_counts(self.train_set, vocab_size)

    def _loader(self, dataset: Dataset, sampler: BucketBatchSampler, loader: type[DataLoader] = DataLoader) -> DataLoader:
        return loader(dataset, batch_sampler=sampler, collate_fn=pad_collate, num_workers=self.num_workers,
                      persistent_workers=self.num_workers > 0)


class ResumingLoader(DataLoader):
    """The training loader, which resumes mid-epoch where the checkpoint left off: `train_dataloader` builds its sampler
    past the batches the restored progress counts, so it keeps no state of its own. Saying so (the `state_dict` interface)
    stops Lightning warning on every mid-epoch resume that the data order is lost."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def _loss_token_counts(input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(input_ids[loss_mask], minlength=vocab_size)[:vocab_size]


def assistant_token_counts(dataset: ConcatDataset, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs among the assistant tokens of a split (`train_set`, `val_set`): [vocab_size] int64."""
    return sum(part.loss_token_counts(vocab_size) for part in dataset.datasets)


def _lengths(dataset: ConcatDataset) -> list[int]:
    return [length for part in dataset.datasets for length in part.lengths()]
