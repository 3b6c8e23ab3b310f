"""The verifier side of a round: a KV cache over the committed prefix, one forward pass over a packed
tree (4-D ancestor mask, depth-based positions), and compaction of the cache to the accepted path.

Masks are additive floats (0 = attend, the dtype's minimum = blocked): transformers hands a 4-D mask
to the attention function unchanged, and eager attention *adds* it to the scores, so a boolean mask
would block nothing there; sdpa takes either form.

Every layer keeps the keys of the whole prefix, sliding-window layers included: the window is applied
by the mask, by *position* (tree nodes sit at prefix length + depth, not at their index in the packed
tree), so compacting the cache to the accepted path is one index select on every layer alike.
"""

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, get_layer_types_and_kwargs

from taps_train.drafter import KVCache
from taps_train.errors import TapsError
from taps_train.decoding.tree import PackedTree

# Flash kernels take only padding masks, so no tree mask can reach them; flex_attention would add the
# float mask like eager does, but is unchecked (it aborts on CPU with torch 2.13).
TREE_MASK_ATTENTION = ("eager", "sdpa")


def layer_windows(config: PretrainedConfig) -> dict[str, int | None]:
    """Attention window per layer type (None: the whole prefix), keyed as the models' mask mappings are."""
    windows: dict[str, set[int | None]] = {}
    for layer_type, kwargs in zip(*get_layer_types_and_kwargs(config)):
        if layer_type == "full_attention":
            window = None
        elif layer_type == "sliding_attention":
            window = kwargs["sliding_window"]
        else:
            raise TapsError(f"verifier layer type {layer_type!r} cannot verify a draft tree; "
                            "only full_attention and sliding_attention layers can")
        windows.setdefault(layer_type, set()).add(window)
    if any(len(sizes) > 1 for sizes in windows.values()):
        raise TapsError(f"verifier layers of one type have different sliding windows ({windows}); tree verification needs one per type")
    return {layer_type: sizes.pop() for layer_type, sizes in windows.items()}


class BufferedLayer(DynamicLayer):
    """A transformers cache layer whose keys and values live in a `KVCache` (buffers written in place), so that a
    verifier call costs what it adds, not a copy of the whole context as `DynamicLayer`'s concatenation does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.store = KVCache()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.store.append(key_states, value_states)
        return self._view()

    def keep(self, start: int, kept: list[int]) -> None:
        self.store.keep(start, kept)
        self._view()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            self.store.crop(len(self.store) + tokens_to_remove)
            self._view()

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`keys`/`values` (what transformers reads) as the store's filled part."""
        self.keys, self.values = self.store.keys, self.store.values
        return self.keys, self.values


class OpenPrefixMask:
    """The additive mask of a tree call when every layer sees the whole prefix: [1, 1, n, prefix + n], zero over the
    prefix and the tree's ancestor mask after it. It lives in one buffer on the verifier's device that stays zero
    except for the block a call writes (and clears after the call), so a round moves n x n values to the device, not
    n x context, and allocates nothing while the buffer is large enough (it doubles when it is not)."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.buffer = torch.zeros(0, 0, dtype=dtype, device=device)
        self.written: tuple[int, int] | None = None  # (rows, first column) of the block in use

    def write(self, tree_mask: torch.Tensor, prefix: int) -> torch.Tensor:
        n, end = len(tree_mask), prefix + len(tree_mask)
        rows, columns = self.buffer.shape
        if n > rows or end > columns:
            self.buffer = torch.zeros(_grown(rows, n), _grown(columns, end, 256), dtype=self.dtype, device=self.device)
        block = torch.zeros(tree_mask.shape, dtype=self.dtype).masked_fill(~tree_mask, torch.finfo(self.dtype).min)
        self.buffer[:n, prefix:end] = block.to(self.device)
        self.written = (n, prefix)
        return self.buffer[None, None, :n, :end]

    def clear(self) -> None:
        """Zero the block the last `write` put in (nothing if none is in use)."""
        if self.written is not None:
            n, prefix = self.written
            self.buffer[:n, prefix : prefix + n] = 0
            self.written = None


def _grown(size: int, needed: int, least: int = 1) -> int:
    """A buffer side: unchanged while large enough, else doubled (at least to `needed`)."""
    return size if needed <= size else max(needed, 2 * size, least)


HiddenStates = dict[int, torch.Tensor]  # transformers `hidden_states` index -> [n, H] (float32), only those asked for


class VerifierSession:
    """One generation's verifier state: the cache holds exactly the committed tokens between calls.

    Each call returns the hidden states `hidden_states` names (the union of the drafters' feature
    contracts); -1 is the post-norm last state."""

    def __init__(self, model: PreTrainedModel, hidden_states: tuple[int, ...] = (-1,)):
        config = model.config.get_text_config(decoder=True)
        if config._attn_implementation not in TREE_MASK_ATTENTION:
            raise TapsError(f"verifier attention {config._attn_implementation!r} cannot apply a tree mask; "
                            f"load the verifier with attn_implementation one of {', '.join(TREE_MASK_ATTENTION)}")
        self.model = model
        self.hidden_states = list(hidden_states)
        self.windows = layer_windows(config)
        self.sees_whole_prefix = set(self.windows.values()) == {None}  # no sliding windows: the prefix part of a mask is all open
        self.cache = Cache(layer_class_to_replicate=BufferedLayer)  # full-length layers everywhere, windows live in the masks
        self.length = 0
        self.max_length = getattr(config, "max_position_embeddings", None)
        self.open_prefix_mask = OpenPrefixMask(model.dtype, self.device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def attention_mask(self, query_positions: torch.Tensor, key_positions: torch.Tensor,
                       allowed: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive [1, 1, q, k] mask from `allowed` [q, k] (structure: causal or tree) cut to each
        layer type's window by position; one tensor when all layers share a type, else a dict keyed by
        layer type (the form transformers 5 models with mixed layers take)."""
        dtype = self.model.dtype
        masks = {}
        for layer_type, window in self.windows.items():
            visible = allowed if window is None else allowed & (query_positions[:, None] - key_positions[None, :] < window)
            blocked = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
            masks[layer_type] = blocked.to(self.device)[None, None]
        return next(iter(masks.values())) if len(masks) == 1 else masks

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, HiddenStates]:
        """Run the prompt [n] into an empty cache; returns the last position's logits [V] (the only ones decoding
        reads: a 2k-token prompt of a 128k-vocabulary verifier would otherwise cost 1 GB of fp32 logits) and the
        hidden states asked for at every position."""
        n = len(ids)
        positions = torch.arange(n)
        mask = self.attention_mask(positions, positions, torch.ones(n, n, dtype=torch.bool).tril())
        out = self.model(input_ids=ids.to(self.device)[None], position_ids=positions.to(self.device)[None], attention_mask=mask,
                         cache=self.cache, use_cache=True, output_hidden_states=self.hidden_states, logits_to_keep=1)
        self.length = n
        return out.logits[0, -1].float(), self._states(out)

    @torch.no_grad()
    def tree_forward(self, packed: PackedTree) -> tuple[torch.Tensor, HiddenStates]:
        """Logits and hidden states of every tree node, one verifier call."""
        n = len(packed.input_ids)
        if not self.sees_whole_prefix:  # windows cut the prefix by position: the whole mask, every call
            allowed = torch.cat([torch.ones(n, self.length, dtype=torch.bool), packed.tree_mask], dim=1)
            key_positions = torch.cat([torch.arange(self.length), packed.position_ids])
            mask = self.attention_mask(packed.position_ids, key_positions, allowed)
        elif n == 1:
            mask = None  # the root alone sees the whole prefix: the model's own causal path, as plain decoding
        else:
            mask = self.open_prefix_mask.write(packed.tree_mask, self.length)
        try:
            out = self.model(
                input_ids=packed.input_ids.to(self.device)[None],
                position_ids=packed.position_ids.to(self.device)[None],
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
                output_hidden_states=self.hidden_states,
            )
        finally:
            self.open_prefix_mask.clear()
        return out.logits[0].float(), self._states(out)

    def _states(self, out) -> HiddenStates:
        return {index: out.hidden_states[index][0].float() for index in self.hidden_states}

    def commit(self, path: list[int]) -> None:
        """Keep the committed prefix plus the accepted tree nodes `path` (root first) in the cache: the path's
        entries move to the front of the tree's slots, so the copy is the path's size, not the cache's."""
        for layer in self.cache.layers:
            layer.keep(self.length, path)
        self.length += len(path)
