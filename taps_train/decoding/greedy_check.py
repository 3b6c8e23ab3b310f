"""The complete T=0 lossless check: every token of a reply is the verifier's argmax after the tokens before it.

One teacher-forced verifier forward over prompt + reply gives the logits at every position of the reply. A token
that is not the argmax passes only where its logit is tied with the top one within the rounding of the verifier's
compute dtype (a tree call and a one-token call round differently, so low precision flips such ties: numerics,
not a decoding error); such tokens are counted. Anything else, and a reply that stops before its budget without a
stop token, is not lossless. Checking the reply on its own history covers every token of every turn, including
those after a tie, which comparing with a plain greedy run cannot (the two runs part there for good).
"""

import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from taps_train.errors import TapsError
from taps_train.decoding.baseline import input_device

TIE_SHARE = 1 / 200  # tied tokens above this share of a benchmark's checked tokens need plain decoding to tie as often
TIE_P = 0.001  # ... or more speculative ties than chance gives (one-sided binomial p below this) are an error


def rounding_tolerance(top_logit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest logit gap the dtype's rounding can flip: 8 units in the last place at the top logit's magnitude,
    at least 1e-3 (float32's error over a deep network)."""
    return torch.clamp(8 * torch.finfo(dtype).eps * top_logit.abs(), min=1e-3)


@dataclass(frozen=True)
class Divergence:
    """A reply token that is neither the verifier's argmax nor tied with it."""

    position: int  # 0-based index into the reply
    token: int | str  # the reply's token, or "end" where it stopped early
    argmax: int
    gap: float
    tolerance: float


@dataclass(frozen=True)
class ReplyCheck:
    tokens: int  # tokens checked
    ties: int  # of those, tokens tied with the argmax within rounding but not the argmax
    divergence: Divergence | None = None


@torch.no_grad()
def check_greedy_reply(model: PreTrainedModel, prompt_ids: list[int], reply: list[int], eos: set[int], max_new_tokens: int) -> ReplyCheck:
    """The complete check of `reply` after `prompt_ids` (see the module docstring)."""
    ids = torch.tensor([prompt_ids + reply], device=input_device(model))
    logits = model(input_ids=ids, logits_to_keep=len(reply) + 1).logits[0].float()  # positions predicting reply[0..] and the next
    chosen = logits[:-1].gather(-1, torch.tensor(reply, device=logits.device)[:, None])[:, 0]
    top, argmax = logits[:-1].max(-1)
    gap = top - chosen
    tolerance = rounding_tolerance(top, model.dtype)
    ties = int(((gap > 0) & (gap <= tolerance)).sum())
    beyond = (gap > tolerance).nonzero()
    if len(beyond):
        at = int(beyond[0])
        return ReplyCheck(len(reply), ties, Divergence(at, reply[at], int(argmax[at]), float(gap[at]), float(tolerance[at])))
    if (not reply or reply[-1] not in eos) and len(reply) < max_new_tokens:  # stopped early: the verifier's next token was due
        return ReplyCheck(len(reply), ties, Divergence(len(reply), "end", int(logits[-1].argmax()), float("inf"),
                                                       float(rounding_tolerance(logits[-1].max(), model.dtype))))
    return ReplyCheck(len(reply), ties)


def not_lossless(where: str, decoding: str, divergence: Divergence) -> TapsError:
    """The one-line error for a divergence of `decoding` ("speculative decoding", "plain decoding") in `where`."""
    got = "an end before its budget" if divergence.token == "end" else f"token {divergence.token}"
    return TapsError(
        f"{where}: {decoding} at T=0 gave {got} at new token {divergence.position + 1} where the verifier's argmax is token "
        f"{divergence.argmax} (logit gap {divergence.gap:.4g}, beyond its dtype's rounding {divergence.tolerance:.2g}): the output is "
        "not lossless; please report it with this prompt"
    )


def too_many_ties(where: str, ties: int, tokens: int, plain: tuple[int, int] | None = None) -> TapsError | None:
    """The error when more than `TIE_SHARE` of a benchmark's checked tokens were ties, unless the verifier's own plain
    decoding, checked the same way (`plain`: its ties, its tokens), ties about as often: in bfloat16 it does (measured
    on SmolLM2: 0.7-0.9% of tokens), so rounding explains the same share of speculative ties. Then the error needs the
    speculative share to exceed plain decoding's beyond chance: a one-sided binomial test of how the ties of both fall
    between them, given their token counts, at `TIE_P`. None when the ties are explained."""
    if ties <= TIE_SHARE * tokens:
        return None
    if plain is not None and plain[1] and _more_than_by_chance(ties, tokens, *plain) >= TIE_P:
        return None
    compared = f", where the verifier's own plain decoding tied {plain[0]} of {plain[1]}" if plain else ""
    return TapsError(
        f"{where}: {ties} of {tokens} tokens at T=0 were not the verifier's argmax but tied with it within its dtype's rounding"
        f"{compared}: more than rounding explains; decode with --verifier-dtype float32, or report it"
    )


def _more_than_by_chance(ties: int, tokens: int, plain_ties: int, plain_tokens: int) -> float:
    """P(at least `ties` of the ties of both decodings fall on the speculative side) if each checked token of either
    were equally likely to tie: the binomial tail with the speculative share of the tokens."""
    total, share = ties + plain_ties, tokens / (tokens + plain_tokens)
    return sum(math.comb(total, k) * share**k * (1 - share) ** (total - k) for k in range(ties, total + 1))
