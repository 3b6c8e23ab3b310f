"""The EAGLE-3 drafter: fused low/mid/high verifier features, its own hidden state fed forward, a
reduced draft vocabulary.

    g_t = fc(concat(h_low, h_mid, h_high))                     at committed positions (3H -> H)
    x   = concat(input_layernorm(embed(x_{t+1})), hidden_norm(g))    (2H: the layer's q/k/v input)
    out = g + attn(x);  out = out + mlp(post_attention_layernorm(out))
    logits over the draft vocabulary = lm_head(norm(out)); `out` (pre-norm) is the next step's g

Two variants engines serve (vLLM, speculators; flags in the config): `norm_before_fc` puts an RMSNorm (`input_norm`)
on the fused features before fc, so the low, mid and high states reach fc at one scale; `norm_output` feeds norm(out)
forward instead of `out` (the head then reads it as is), so the hidden state keeps its scale over a draft's depth.

Inside a draft the drafter reads its own `out` instead of verifier features (no fc). `lm_head` is
trained and covers `draft_vocab_size` tokens; `d2t[i]` is the offset from draft id i to its verifier
id (verifier id = i + d2t[i]) and `t2d` marks the verifier ids in the draft vocabulary, as EAGLE-3
checkpoints store them. Logits come out in the verifier's vocabulary, -inf outside the draft one.
Parameter names follow the EAGLE-3 checkpoint layout (`midlayer.*`, `fc`, `norm`, `lm_head`).
"""

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from taps_train.drafter.backbone import DrafterBackbone, check_tensors, register
from taps_train.drafter.config import drafter_config, vocab_tokens
from taps_train.features import FeatureContract, check_layers
from taps_train.drafter.model import DrafterAttention, KVCache, layer_shapes, verifier_sized
from taps_train.errors import TapsError

TTT_STEPS = 7
NORM_VARIANTS = ("norm_before_fc", "norm_output")  # config flags; False when absent (drafts from before them)
UNBUILT_VARIANTS = ("norm_before_residual", "fc_norm")  # other EAGLE-3 variants vLLM serves, which taps-train does not build
FUSED_LAYERS = 3  # low, mid, high: serving engines' fc reads three verifier states (3H -> H)


def capturable_layers(num_layers: int) -> range:
    """The `hidden_states` indices serving engines capture for EAGLE-3: the inputs of decoder layers 1..L-1. Not 0 (the
    embeddings: vLLM and SGLang cannot name them) nor L (the post-norm output, which engines never capture)."""
    return range(1, num_layers)


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high verifier states, the inputs of decoder layers 2, L/2 and L-3 (`hidden_states` indices),
    where these are distinct (L >= 7); below that 1, L/2 and L-1, distinct from 4 layers on. A toy verifier of 2 or 3
    layers has fewer than three capturable states and gets each of them, repeated: taps-train trains and decodes with
    that, but speculators refuses repeated layer ids and vLLM/SGLang capture a layer once, so no engine serves it."""
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers >= 2:
        return (1, num_layers // 2, num_layers - 1)
    raise TapsError(f"the verifier has {num_layers} decoder layer(s), so no hidden state engines capture for EAGLE-3 (the inputs "
                    f"of decoder layers 1..L-1): use a verifier of at least 4 layers (three distinct states), or an EAGLE-2/HASS drafter")


def check_feature_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """User-chosen fused layers: three capturable states in ascending order (engines concatenate them in layer order,
    whatever order the config lists) and distinct (speculators requires it), or, on a verifier with fewer than three
    capturable states, each of those."""
    layers, capturable = tuple(layers), capturable_layers(num_layers)
    distinct = min(FUSED_LAYERS, len(capturable))
    if (len(layers) == FUSED_LAYERS and all(isinstance(i, int) and not isinstance(i, bool) and i in capturable for i in layers)
            and list(layers) == sorted(layers) and len(set(layers)) == distinct):
        return layers
    rule = "distinct " if distinct == FUSED_LAYERS else ""
    each = "" if distinct == FUSED_LAYERS else f", each of those {distinct} at least once"
    raise TapsError(f"feature_layers must be {FUSED_LAYERS} {rule}verifier hidden_states indices in ascending order within "
                    f"{capturable.start}..{capturable.stop - 1} (the decoder-layer inputs serving engines capture){each}, got "
                    f"{list(layers)}; use e.g. {list(default_feature_layers(num_layers))} (the default when unset)")


def draft_token_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The verifier id of each draft id: `d2t` holds offsets."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


def token_maps(token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`d2t` and `t2d` of the draft vocabulary `token_ids` (distinct verifier ids, ascending)."""
    d2t = token_ids - torch.arange(len(token_ids), device=token_ids.device)
    return d2t, torch.zeros(vocab_size, dtype=torch.bool, device=token_ids.device).index_fill(0, token_ids, True)


def eagle3_config(verifier_config: PretrainedConfig, draft_vocab_size: int | float,
                  feature_layers: tuple[int, ...] | None = None, norm_before_fc: bool = False, norm_output: bool = False) -> LlamaConfig:
    """The verifier's sizes (as EAGLE-1/2's config takes them) plus the draft vocabulary (in tokens), the fused layers
    and the norm variants."""
    text = verifier_config.get_text_config(decoder=True)
    config = drafter_config(verifier_config)
    config.architectures = [Eagle3Drafter.architecture]
    config.draft_vocab_size = vocab_tokens(draft_vocab_size, text.vocab_size, "draft_vocab_size")
    config.target_hidden_size = text.hidden_size
    layers = tuple(feature_layers) if feature_layers else default_feature_layers(text.num_hidden_layers)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    config.norm_before_fc, config.norm_output = norm_before_fc, norm_output
    return config


def norm_variants(config: PretrainedConfig | dict) -> dict[str, bool]:
    """The norm flags of a drafter config (or its dict, as checkpoints store it)."""
    values = config if isinstance(config, dict) else vars(config)
    return {flag: bool(values.get(flag, False)) for flag in NORM_VARIANTS}


class Eagle3Layer(nn.Module):
    """A Llama decoder layer whose attention reads the token embedding and the hidden state side by side."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, input_size=2 * config.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)


@register("LlamaForCausalLMEagle3")
class Eagle3Drafter(DrafterBackbone):
    label = "EAGLE-3"
    # SGLang's EAGLE-3 draft class; vLLM's method "eagle3" makes LlamaForCausalLM its Eagle3LlamaForCausalLM; the
    # speculators library's own class.
    serving = {"eagle": "LlamaForCausalLMEagle3", "vllm": "LlamaForCausalLM", "speculators": "Eagle3Speculator"}
    vllm_method = "eagle3"
    decoder_layer = "midlayer"  # its attention reads [embedding, hidden]: twice the verifier layer's input width

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        hidden, vocab, draft_vocab = config.hidden_size, config.vocab_size, config.draft_vocab_size
        self.embed_tokens = nn.Embedding(vocab, hidden, device="meta")  # the verifier's, with `use_verifier_parts`
        norm_before_fc, self.norm_output = norm_variants(config).values()
        fused = len(self.feature_layers) * config.target_hidden_size
        self.input_norm = LlamaRMSNorm(fused, eps=config.rms_norm_eps) if norm_before_fc else None
        self.fc = nn.Linear(fused, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # The identity map until `set_vocabulary` (a full draft vocabulary needs no other).
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(vocab) < draft_vocab)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.config.eagle_config["eagle_aux_hidden_state_layer_ids"])

    @classmethod
    def config_for(cls, verifier_config: PretrainedConfig, draft_vocab_size: int | float = 32000,
                   feature_layers: tuple[int, ...] | None = None, norm_before_fc: bool = False, norm_output: bool = False) -> LlamaConfig:
        return eagle3_config(verifier_config, draft_vocab_size, feature_layers, norm_before_fc, norm_output)

    @classmethod
    def tensor_shapes(cls, config: LlamaConfig, bias: bool, embeddings: bool) -> dict[str, tuple[int, ...]]:
        hidden = config.hidden_size
        layers = len(config.eagle_config["eagle_aux_hidden_state_layer_ids"])
        shapes = {
            **({"input_norm.weight": (layers * config.target_hidden_size,)} if norm_variants(config)["norm_before_fc"] else {}),
            "fc.weight": (hidden, layers * config.target_hidden_size),
            "midlayer.input_layernorm.weight": (hidden,),
            "midlayer.hidden_norm.weight": (hidden,),
            **layer_shapes(config, "midlayer", attention_input=2 * hidden),
            "norm.weight": (hidden,),
            "lm_head.weight": (config.draft_vocab_size, hidden),
        }
        if embeddings:
            shapes["embed_tokens.weight"] = (config.vocab_size, hidden)
        return {**shapes, "d2t": (config.draft_vocab_size,), "t2d": (config.vocab_size,)}

    def feature_contract(self) -> FeatureContract:
        return FeatureContract(self.feature_layers)

    @classmethod
    def serving_fields(cls, config: LlamaConfig, layer_offset: int) -> dict:
        layers = [i + layer_offset for i in config.eagle_config["eagle_aux_hidden_state_layer_ids"]]
        return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True}, **norm_variants(config)}

    @classmethod
    def check_servable(cls, config: LlamaConfig, verifier_layers: int | None, where: str) -> None:
        """Engines capture the inputs of decoder layers 1..L-1 (SGLang cannot name the embeddings, and neither engine
        the post-norm output), each once, and concatenate them in layer order: a drafter fusing other states, or the
        same ones in another order, would read different features there, and one fusing a state twice (the default
        on a verifier of under 4 layers) cannot be served."""
        layers = config.eagle_config["eagle_aux_hidden_state_layer_ids"]
        outside = [i for i in layers if i < 1 or (verifier_layers is not None and i >= verifier_layers)]
        if outside:
            raise TapsError(f"{where} fuses verifier hidden states {layers}; serving engines capture only the inputs of decoder "
                            f"layers 1..{verifier_layers - 1 if verifier_layers else 'L-1'}, so {outside} cannot be served. "
                            "Train with feature_layers inside that range")
        if layers != sorted(layers):
            raise TapsError(f"{where} fuses verifier hidden states {layers}; serving engines concatenate them in layer order, "
                            f"so its fc would read them permuted. Train with feature_layers in ascending order")
        if len(set(layers)) < len(layers):
            warnings.warn(f"{where} fuses verifier hidden states {layers}, one of them twice (its verifier has fewer than three "
                          "that engines capture); taps-train reads this export back, but speculators refuses repeated layer ids and "
                          "vLLM/SGLang capture each layer once, so no engine serves it", stacklevel=4)

    @classmethod
    def trained_as(cls, config: LlamaConfig) -> str:
        return "eagle3"

    @classmethod
    def reads(cls, config_dict: dict) -> bool:
        return "draft_vocab_size" in config_dict

    @classmethod
    def from_serving(cls, config_dict: dict, tensors: dict[str, torch.Tensor], verifier_config: PretrainedConfig, where: str,
                     layer_offset: int) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
        """`t2d`, which SGLang never reads, is rebuilt from `d2t` when absent. A norm flag counts where vLLM looks for it
        (`eagle_config`, then the top level); the variants taps-train does not build are refused, not drafted without."""
        try:
            eagle_config = dict(config_dict["eagle_config"])
            layers = [int(i) - layer_offset for i in eagle_config["eagle_aux_hidden_state_layer_ids"]]
        except (KeyError, TypeError, ValueError) as err:
            raise TapsError(f"{where}: config.json lacks eagle_config.eagle_aux_hidden_state_layer_ids; it is not an EAGLE-3 draft") from err
        flags = {flag: bool(eagle_config.get(flag, config_dict.get(flag, False))) for flag in (*NORM_VARIANTS, *UNBUILT_VARIANTS)}
        if unbuilt := [flag for flag in UNBUILT_VARIANTS if flags.pop(flag)]:
            raise TapsError(f"{where}: the draft sets {unbuilt}; taps-train's EAGLE-3 drafter has no such variant (it builds "
                            f"{' and '.join(NORM_VARIANTS)}) and would draft differently")
        check_layers(FeatureContract(tuple(layers)), verifier_config, "given to read " + where)
        config = LlamaConfig.from_dict({**config_dict, **flags, "architectures": [cls.architecture],
                                        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}})
        config.target_hidden_size = getattr(config, "target_hidden_size", None) or config.hidden_size
        if "t2d" not in tensors and "d2t" in tensors:
            tensors["t2d"] = token_maps(draft_token_ids(tensors["d2t"]), config.vocab_size)[1]
        check_tensors(tensors, cls.tensor_shapes(config, bias=False, embeddings="embed_tokens.weight" in tensors), where, cls.index_tensors())
        return config, tensors

    @classmethod
    def align_for_averaging(cls, states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict:
        """EAGLE-3 drafters pick their draft vocabularies from their own training sets, so row i of one drafter's head
        scores another token than row i of the other's. Every head is re-indexed onto the union of the vocabularies of
        the drafters with weight > 0 (in verifier-id order, as `set_vocabulary` keeps them): a token a drafter
        lacks gets a zero row there, i.e. that drafter adds nothing to its logit. A weight-0 drafter adds no tokens,
        so weights 1/0 give back the first drafter exactly."""
        own = [draft_token_ids(state["drafter.d2t"]) for state in states]
        union = torch.cat([ids for ids, weight in zip(own, weights) if weight > 0]).unique()
        for state, ids in zip(states, own):
            rows = torch.searchsorted(union, ids).clamp(max=len(union) - 1)
            kept = union[rows] == ids
            head = state["drafter.lm_head.weight"]
            state["drafter.lm_head.weight"] = head.new_zeros(len(union), head.shape[1]).index_copy(0, rows[kept], head[kept])
            state["drafter.d2t"], state["drafter.t2d"] = token_maps(union, len(state["drafter.t2d"]))
        return {"draft_vocab_size": len(union)}

    @classmethod
    def frozen_parameter_names(cls) -> list[str]:
        return ["embed_tokens.weight"]

    def use_verifier_parts(self, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        """The verifier's embedding, frozen; its LM head gives the training targets, not this drafter's logits."""
        verifier_sized(embedding, (self.config.vocab_size, self.config.hidden_size), "embedding")
        self.embed_tokens.weight = nn.Parameter(embedding.detach(), requires_grad=False)
        self.register_buffer("verifier_head", lm_head.detach(), persistent=False)  # moves with the module, never saved

    def cast_verifier_parts(self, dtype: torch.dtype) -> None:
        if self.embed_tokens.weight.dtype != dtype:
            self.embed_tokens.weight = nn.Parameter(self.embed_tokens.weight.detach().to(dtype), requires_grad=False)

    def chosen_vocabulary_size(self) -> int | None:
        return self.config.draft_vocab_size

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Use the verifier ids `token_ids` (distinct, `draft_vocab_size` of them) as the draft vocabulary, in
        ascending order as EAGLE-3 checkpoints list them."""
        ids = token_ids.unique().sort().values.to(self.d2t.device)
        if len(ids) != self.config.draft_vocab_size or len(token_ids) != len(ids):
            raise TapsError(f"a draft vocabulary needs {self.config.draft_vocab_size} distinct token ids, got {len(token_ids)}")
        d2t, t2d = token_maps(ids, len(self.t2d))
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """The verifier id of each draft id."""
        return draft_token_ids(self.d2t)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The hidden state a step reads: fc over fused verifier features, or (inside a draft) its own."""
        dtype = self.fc.weight.dtype
        if features.shape[-1] != self.fc.in_features:
            return features.to(dtype)
        return self.fc(self.input_norm(features.to(dtype)) if self.input_norm is not None else features.to(dtype))

    def _step(self, next_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
              keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """One pass of the layer; its keys/values are appended to `keys`/`values`, which it attends over."""
        layer = self.midlayer
        embedded = self.embed_tokens(next_ids).to(hidden.dtype)
        x = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
        q, k, v = layer.self_attn.project(x, self.rotary_emb(hidden, position_ids))
        keys.append(k)
        values.append(v)
        out = hidden + layer.self_attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask)
        out = out + layer.mlp(layer.post_attention_layernorm(out))
        return self.norm(out) if self.norm_output else out

    def forward(self, next_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        hidden = self.fuse(features)
        keys, values = ([cache.keys], [cache.values]) if cache is not None and len(cache) else ([], [])
        out = self._step(next_ids, hidden, position_ids, mask, keys, values)
        if cache is not None:
            cache.append(keys[-1], values[-1])
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        draft = self.draft_logits(hidden.to(self.lm_head.weight.dtype))
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy(-1, self.draft_token_ids, draft)

    def proposal_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draft_logits(hidden.to(self.lm_head.weight.dtype)), self.draft_token_ids

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary only. Module calls throughout: ZeRO-3 gathers a trained weight only
        inside its own module's forward. A `norm_output` drafter's hidden states are normed already."""
        return self.lm_head(hidden if self.norm_output else self.norm(hidden))

    def unroll(self, next_ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: pass k (0-based) reads at index t the token x_{t+k+1} at position t+k and, for k > 0,
        its own output of pass k-1 at index t, attending to the committed context (pass 0's keys at indices <= t)
        and to its own earlier passes at index t: exactly what drafting k levels deep below x_{t+1} sees. Pass k's
        index t guesses x_{t+k+2}, so its targets lie k positions later (`target_lag`)."""
        batch, length = next_ids.shape
        positions = torch.arange(length, device=next_ids.device)[None].expand(batch, -1)
        hidden, keys, values, outputs = self.fuse(features), [], [], []
        for step in range(steps):
            ids = F.pad(next_ids[:, step:], (0, step))  # x_{t+k+1}; past the end: padding no target reads
            hidden = self._step(ids, hidden, positions + step, ttt_mask(length, step, next_ids.device), keys, values)
            outputs.append(hidden)
        return outputs

    @staticmethod
    def target_lag(step: int) -> int:
        return step

    @classmethod
    def index_tensors(cls) -> dict[str, torch.dtype]:
        return {"d2t": torch.long, "t2d": torch.bool}

    @classmethod
    def variant_flags(cls, config: LlamaConfig | dict) -> dict[str, bool]:
        return norm_variants(config)


def ttt_mask(length: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """bool [T, (step+1) T]: pass `step` at index t attends to pass 0's keys at indices <= t (causal) and to
    pass m's key at index t for 1 <= m <= step (its drafted ancestors and itself)."""
    eye = torch.eye(length, dtype=torch.bool, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return torch.cat([causal] + [eye] * step, dim=1)
