"""The EAGLE-1/2 drafter network (HASS trains the same one).

    x_{t+1}, f_t  ->  fc(concat(embed(x_{t+1}), f_t))  ->  one decoder layer  ->  f̂_{t+1}
    logits(x_{t+2}) = lm_head(f̂_{t+1})

`embed_tokens` and `lm_head` are copies of the verifier's and stay frozen. The features `f` are the
verifier's post-norm last hidden states, so the LM head applies directly (no final norm). The layer
has no input norm before attention (EAGLE's choice: the fc output already mixes normed features).

Attention is `scaled_dot_product_attention` with an explicit boolean mask and an optional list of
extra key/value blocks, which is all that training (causal, HASS alignment) and tree drafting
(KV cache + tree mask) need.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from taps_train.drafter.backbone import DrafterBackbone, check_tensors, register
from taps_train.drafter.config import drafter_config, vocab_tokens
from taps_train.features import EAGLE_FEATURES, FeatureContract
from taps_train.errors import TapsError


class KVCache:
    """Keys/values of positions already processed, [B, kv_heads, S, head_dim] each, kept in buffers that grow by
    doubling: an append writes in place and a crop moves the length, so a decoding round costs what it adds, not a
    copy of the whole context (which `torch.cat` would cost on every call). `keys`/`values` are views of the filled
    part. The speculative decoder's verifier cache (decoding/verify.py) keeps its layers in these too."""

    def __init__(self):
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = self.length + keys.shape[2]
        if self._keys is None or end > self._keys.shape[2]:
            self._grow(keys, values, end)
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end

    def _grow(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        capacity = max(needed, 2 * (0 if self._keys is None else self._keys.shape[2]), 64)
        grown = []
        for old, new in ((self._keys, keys), (self._values, values)):
            buffer = new.new_empty(*new.shape[:2], capacity, new.shape[3])
            if old is not None:
                buffer[:, :, : self.length] = old[:, :, : self.length]
            grown.append(buffer)
        self._keys, self._values = grown

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        self.length = min(self.length, length)

    def keep(self, start: int, kept: list[int]) -> None:
        """Keep the first `start` positions and then the positions `start + kept` (ascending), moved to follow them:
        a copy of `len(kept)` entries, however long the cache, and none when they are in place already (a plain round,
        a chain accepted from its start)."""
        end = start + len(kept)
        if kept != list(range(len(kept))):
            picked = start + torch.tensor(kept, device=self._keys.device)  # on each layer's device (a sharded verifier)
            self._keys[:, :, start:end] = self._keys.index_select(2, picked)
            self._values[:, :, start:end] = self._values.index_select(2, picked)
        self.length = end


class DrafterAttention(nn.Module):
    def __init__(self, config: LlamaConfig, input_size: int | None = None):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        width = input_size or config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, H, T, d] and keys/values [B, KVH, T, d] with RoPE applied."""
        batch, length, _ = hidden.shape
        q = self.q_proj(hidden).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`mask` is boolean, True = may attend, broadcastable to [B, H, T, S]."""
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        batch, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class DrafterLayer(nn.Module):
    """A Llama decoder layer without the input norm."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = DrafterAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@register("LlamaForCausalLMEagle")
class Drafter(DrafterBackbone):
    """EAGLE-1/2, and HASS (same network, other training): one Llama layer over the verifier's last feature."""

    label = "EAGLE-1/2"
    # SGLang's EAGLE draft class; vLLM prefixes the architecture with `Eagle` itself (-> its EagleLlamaForCausalLM).
    serving = {"eagle": "LlamaForCausalLMEagle", "vllm": "LlamaForCausalLM"}
    vllm_method = "eagle"
    # The proposal vocabulary is taps-train's decoder's alone: engines draft EAGLE-1/2 over the whole vocabulary.
    decoder_only = ("proposal_ids", "proposal_vocab_size")
    decoder_layer = "layers.0"

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        # The verifier's embedding and LM head arrive with `use_verifier_parts`; until then they are
        # shapes without storage (at Llama-3's vocabulary a random float32 pair would be 4 GB).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device="meta")
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=getattr(config, "fc_bias", False))
        self.layers = nn.ModuleList([DrafterLayer(config)])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        # The tokens drafting may propose (verifier ids, ascending; None: all). Each drafted level reads the LM head's
        # rows: at SmolLM2's 49k-token vocabulary ~17 ms a level on a 2-core CPU against ~57 ms for a one-token verifier
        # call, and a specialist's text uses a few thousand tokens. Training and the loss keep the whole vocabulary.
        size = getattr(config, "proposal_vocab_size", None)
        self.register_buffer("proposal_ids", torch.arange(size) if size else None)
        self._proposal_rows: tuple[tuple, torch.Tensor] | None = None

    @classmethod
    def config_for(cls, verifier_config: PretrainedConfig, fc_bias: bool = False, proposal_vocab_size: int | float | None = None) -> LlamaConfig:
        config = drafter_config(verifier_config, fc_bias)
        if proposal_vocab_size is not None:
            config.proposal_vocab_size = vocab_tokens(proposal_vocab_size, config.vocab_size, "proposal_vocab_size")
        return config

    @classmethod
    def tensor_shapes(cls, config: LlamaConfig, bias: bool, embeddings: bool) -> dict[str, tuple[int, ...]]:
        hidden = config.hidden_size
        shapes = {"fc.weight": (hidden, 2 * hidden), **layer_shapes(config, "layers.0", attention_input=hidden)}
        if bias:
            shapes["fc.bias"] = (hidden,)
        if embeddings:
            shapes["embed_tokens.weight"] = (config.vocab_size, hidden)
        if getattr(config, "proposal_vocab_size", None):
            shapes["proposal_ids"] = (config.proposal_vocab_size,)
        return shapes

    @classmethod
    def index_tensors(cls) -> dict[str, torch.dtype]:
        return {"proposal_ids": torch.long}

    def feature_contract(self) -> FeatureContract:
        return EAGLE_FEATURES

    @classmethod
    def trained_as(cls, config: LlamaConfig) -> str:
        return "hass" if getattr(config, "fc_bias", False) else "eagle2"  # HassModule's default fc bias is true, Eagle2Module's false

    @classmethod
    def reads(cls, config_dict: dict) -> bool:
        return "draft_vocab_size" not in config_dict  # an EAGLE-1/2 draft predicts over the whole vocabulary

    @classmethod
    def from_serving(cls, config_dict: dict, tensors: dict[str, torch.Tensor], verifier_config: PretrainedConfig, where: str,
                     layer_offset: int) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
        """`fc_bias` says whether the drafter was trained with one; SGLang's zero `fc.bias` of a drafter trained
        without is dropped (checked zero)."""
        has_bias = "fc.bias" in tensors
        config = LlamaConfig.from_dict({**config_dict, "architectures": [cls.architecture]})
        config.fc_bias = bool(config_dict.get("fc_bias", has_bias))
        check_tensors(tensors, cls.tensor_shapes(config, bias=has_bias or config.fc_bias, embeddings="embed_tokens.weight" in tensors), where)
        if has_bias and not config.fc_bias:
            if tensors["fc.bias"].any():
                raise TapsError(f"{where}: config.json says fc_bias false but fc.bias is not zero; fix config.json")
            del tensors["fc.bias"]
        return config, tensors

    @classmethod
    def frozen_parameter_names(cls) -> list[str]:
        return ["embed_tokens.weight", "lm_head.weight"]

    def use_verifier_parts(self, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        """Adopt the verifier's input embedding [V, H] and LM head [V, H] as frozen parameters.

        The tensors are used as given (no copy, their dtype and device kept), so a drafter next to
        a loaded verifier shares its memory, and one built from files holds one copy in the file's dtype.
        """
        expected = (self.config.vocab_size, self.config.hidden_size)
        verifier_sized(embedding, expected, "embedding")
        verifier_sized(lm_head, expected, "LM head")
        self.embed_tokens.weight = nn.Parameter(embedding.detach(), requires_grad=False)
        tied = lm_head is embedding  # one parameter, so a cast keeps one copy
        self.lm_head.weight = self.embed_tokens.weight if tied else nn.Parameter(lm_head.detach(), requires_grad=False)

    def cast_verifier_parts(self, dtype: torch.dtype) -> None:
        """Keep the frozen parts in the dtype training computes in (bf16 under bf16-mixed), one copy."""
        if self.embed_tokens.weight.dtype == self.lm_head.weight.dtype == dtype:
            return
        tied = self.embed_tokens.weight is self.lm_head.weight
        self.embed_tokens.weight = nn.Parameter(self.embed_tokens.weight.detach().to(dtype), requires_grad=False)
        self.lm_head.weight = self.embed_tokens.weight if tied else nn.Parameter(self.lm_head.weight.detach().to(dtype), requires_grad=False)

    def layer_input(self, next_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc(concat(embed(x_{t+1}), f_t)): [B, T, H], computed in the drafter's own dtype (bf16 when an engine
        such as DeepSpeed trains bf16 weights; float32 features and a bf16 embedding come in regardless)."""
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([self.embed_tokens(next_ids).to(dtype), features.to(dtype)], dim=-1))

    def rope(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(hidden, position_ids)

    def forward(
        self,
        next_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Predicted next features [B, T, H].

        `mask` ([T, len(cache) + T] or broadcastable, boolean) says which cached and new positions each
        new position attends to; new keys/values are appended to `cache` when one is given.
        """
        layer = self.layers[0]
        hidden = self.layer_input(next_ids, features)
        q, k, v = layer.self_attn.project(hidden, self.rope(hidden, position_ids))
        if cache is not None:
            cache.append(k, v)
            k, v = cache.keys, cache.values
        return layer.finish(hidden, layer.self_attn.attend(q, k, v, mask))

    def unroll(self, next_ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """HASS's harmonized context alignment (steps = 1: plain EAGLE training). Pass n reads, at position s, the
        prediction of f_s made at position s-1 in pass n-1 (detached) and attends to the keys of the most recent
        n-1 positions from those predictions, as it will when drafting n levels deep (`alignment_mask`)."""
        length = next_ids.shape[1]
        positions = torch.arange(length, device=next_ids.device)[None].expand(next_ids.shape[0], -1)
        layer = self.layers[0]
        keys, values, inputs, predictions = [], [], features, []
        for step in range(1, steps + 1):
            hidden = self.layer_input(next_ids, inputs)
            q, k, v = layer.self_attn.project(hidden, self.rope(hidden, positions))
            keys.append(k)
            values.append(v)
            mask = alignment_mask(length, step, next_ids.device)
            predictions.append(layer.finish(hidden, layer.self_attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask)))
            inputs = torch.cat([features[:, :1], predictions[-1][:, :-1].detach()], dim=1)
        return predictions

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Verifier-vocabulary logits, computed in the LM head's dtype (which may be lower than the features')."""
        return F.linear(features.to(self.lm_head.weight.dtype), self.lm_head.weight)

    def proposal_logits(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.proposal_ids is None:
            return self.logits(features), None
        return F.linear(features.to(self.lm_head.weight.dtype), self._proposal_head()), self.proposal_ids

    def _proposal_head(self) -> torch.Tensor:
        """The LM head's rows of the proposal vocabulary, gathered once per head and vocabulary (a cast or a move of the
        head, or a new vocabulary, gathers them again)."""
        head = self.lm_head.weight
        key = (head.data_ptr(), head.dtype, head.device, self.proposal_ids.data_ptr(), self.proposal_ids._version)
        if self._proposal_rows is None or self._proposal_rows[0] != key:
            self._proposal_rows = key, head.index_select(0, self.proposal_ids.to(head.device))
        return self._proposal_rows[1]

    def chosen_vocabulary_size(self) -> int | None:
        return getattr(self.config, "proposal_vocab_size", None)

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Kept in ascending order."""
        ids = token_ids.unique().sort().values
        if self.proposal_ids is None or len(ids) != len(self.proposal_ids) or len(token_ids) != len(ids):
            raise TapsError(f"a proposal vocabulary needs {getattr(self.config, 'proposal_vocab_size', None)} distinct token ids, "
                            f"got {len(token_ids)}")
        self.proposal_ids.copy_(ids.to(self.proposal_ids.device))

    @classmethod
    def align_for_averaging(cls, states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict:
        """An average proposes what any of its drafters with weight > 0 proposes: the union of their proposal
        vocabularies, or the whole vocabulary when one of them proposes from all of it."""
        own = [state.get("drafter.proposal_ids") for state, weight in zip(states, weights) if weight > 0]
        if all(ids is None for ids in own) and all("drafter.proposal_ids" not in state for state in states):
            return {}
        if any(ids is None for ids in own):
            for state in states:
                state.pop("drafter.proposal_ids", None)
            return {"proposal_vocab_size": None}
        union = torch.cat(own).unique()
        for state in states:
            state["drafter.proposal_ids"] = union.clone()
        return {"proposal_vocab_size": len(union)}


def alignment_mask(length: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Which keys a query attends to at HASS alignment step `step` (1-based): bool [T, step*T].

    Keys are the concatenation of the K/V blocks of steps 1..step. Query s sees, at position j <= s,
    the key from step m = step - (s - j): the most recent `step - 1` positions come from the drafter's
    own earlier predictions, older ones (m would be < 1) from the true features of step 1.
    """
    s = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    distance = s - j
    blocks = []
    for m in range(1, step + 1):
        if m == 1:
            blocks.append((distance >= step - 1) & (distance >= 0))
        else:
            blocks.append(distance == step - m)
    return torch.cat(blocks, dim=1)


def verifier_sized(tensor: torch.Tensor, expected: tuple[int, int], name: str) -> None:
    """A verifier part of the shape the drafter config was derived for."""
    if tuple(tensor.shape) != expected:
        raise TapsError(f"verifier {name} has shape {tuple(tensor.shape)}, the drafter config needs {expected}")


def layer_shapes(config: LlamaConfig, prefix: str, attention_input: int) -> dict[str, tuple[int, ...]]:
    """The attention, post-attention norm and MLP tensors of one drafter layer named `prefix`."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    return {
        f"{prefix}.self_attn.q_proj.weight": (q_width, attention_input),
        f"{prefix}.self_attn.k_proj.weight": (kv_width, attention_input),
        f"{prefix}.self_attn.v_proj.weight": (kv_width, attention_input),
        f"{prefix}.self_attn.o_proj.weight": (hidden, q_width),
        f"{prefix}.post_attention_layernorm.weight": (hidden,),
        f"{prefix}.mlp.gate_proj.weight": (inner, hidden),
        f"{prefix}.mlp.up_proj.weight": (inner, hidden),
        f"{prefix}.mlp.down_proj.weight": (hidden, inner),
    }
