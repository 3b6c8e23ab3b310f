"""Lossless acceptance of a verified tree.

Greedy (T=0): follow the child whose token is the verifier's argmax, as long as there is one.

Sampling (T>0) with deterministic candidates: at each accepted node, try its children in order of
draft probability; accept token x with probability p(x) under the current residual distribution; on
rejection set p(x) = 0 and renormalize (a duplicate sibling then has probability 0 and is skipped).
If every child is rejected, the bonus token is drawn from the residual; after an accepted leaf, from
the leaf's full distribution. Each emitted token is therefore distributed exactly as the verifier's.
"""

from dataclasses import dataclass

import torch

from taps_train.decoding.tree import DraftTree


@dataclass
class Acceptance:
    path: list[int]  # accepted tree nodes, root first
    bonus: int  # the verifier's own token after the path
    rejected: list[int]  # candidates the verifier examined and refused


def verifier_distribution(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Softmax at `temperature`, restricted to the smallest top-p nucleus when `top_p < 1`."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # tokens after the nucleus is complete
        sorted_p[outside] = 0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """One token from the verifier's own logits [V]: the argmax at T=0, else a draw from its distribution."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(verifier_distribution(logits, temperature, top_p).cpu().double(), 1, generator=generator))


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    path, rejected = [0], []
    targets = logits.argmax(-1).tolist()
    while True:
        node = path[-1]
        match = next((c for c in tree.children(node) if int(tree.tokens[c]) == targets[node]), None)
        rejected += [c for c in tree.children(node) if c != match]
        if match is None:
            return Acceptance(path, targets[node], rejected)
        path.append(match)


def accept_sampling(tree: DraftTree, logits: torch.Tensor, temperature: float, generator: torch.Generator, top_p: float = 1.0) -> Acceptance:
    path, rejected = [0], []
    while True:
        node = path[-1]
        p = verifier_distribution(logits[node], temperature, top_p).cpu().double()
        accepted = None
        for child in tree.children(node):
            x = int(tree.tokens[child])
            if p[x] <= 0:  # a duplicate of a rejected sibling, or outside the nucleus
                rejected.append(child)
                continue
            if torch.rand((), generator=generator, dtype=torch.float64) < p[x]:
                accepted = child
                break
            rejected.append(child)
            p[x] = 0
            p /= p.sum()
        if accepted is None:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return Acceptance(path, bonus, rejected)
        path.append(accepted)
