"""Where a verifier's reply ends, and its plain greedy reply.

The stop set comes from the model and its tokenizer, never from token names taps-train knows: a real
model's generation config lists its end-of-sequence ids (Llama-3-Instruct: `<|end_of_text|>` and
`<|eot_id|>`), and its chat template closes each assistant turn with a special token (ChatML's
`<|im_end|>`) that decoding must stop at even when the configs forget it.
"""

from typing import TYPE_CHECKING

import torch
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from taps_train.errors import TapsError
from taps_train.data.chat_format import end_of_turn_token, render_chat, vocabulary_id

if TYPE_CHECKING:
    from taps_train.verifier.loading import VerifierFiles


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end a reply: the generation config's and config's eos ids, the tokenizer's eos (when its name is
    a vocabulary entry, never the unknown token's id) and the chat template's end-of-turn token."""
    return stop_token_ids_of(model.config, model.generation_config, tokenizer)


def stop_token_ids_of(config: PretrainedConfig, generation_config: GenerationConfig | None, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """`stop_token_ids` from a verifier's files, without building the model (an engine elsewhere runs it)."""
    ids = [generation_config.eos_token_id if generation_config is not None else None, config.get_text_config(decoder=True).eos_token_id,
           vocabulary_id(tokenizer, tokenizer.eos_token), end_of_turn_token(tokenizer)]
    flat = [i for entry in ids for i in (entry if isinstance(entry, list) else [entry])]
    return sorted({int(i) for i in flat if i is not None and 0 <= int(i) < len(tokenizer)})


def files_stop_token_ids(files: "VerifierFiles") -> list[int]:
    """`stop_token_ids` from a verifier's files (its generation config when it has one), without building it."""
    try:
        generation_config = GenerationConfig.from_pretrained(files.path)
    except OSError:  # no generation_config.json
        generation_config = None
    return stop_token_ids_of(files.config, generation_config, files.tokenizer)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, prompt: str, max_new_tokens: int) -> torch.Tensor:
    """One user message in the verifier's chat template, as ids [1, n]; refused in one line when it and the reply
    cannot fit the verifier's context (a whole user text would otherwise prefill for minutes, then fail)."""
    ids = tokenizer(render_chat(tokenizer, [{"role": "user", "content": prompt}]), add_special_tokens=False, return_tensors="pt")["input_ids"]
    context = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    if context and ids.shape[1] + max_new_tokens > context:
        raise TapsError(f"the prompt is {ids.shape[1]:,} tokens with its chat template and the reply may take {max_new_tokens:,} more, past "
                        f"the verifier's context of {context:,} tokens; shorten the prompt or ask for fewer new tokens")
    return ids


def greedy_reply(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int) -> str:
    """The model's greedy answer to one user message, formatted with its chat template, up to its stop token."""
    ids = prompt_ids(tokenizer, model.config, prompt, max_new_tokens).to(model.device)
    stop = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop or [None])[0]
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop, pad_token_id=pad,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
