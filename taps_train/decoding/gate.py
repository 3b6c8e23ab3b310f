"""Speculate only while it pays: a drafter out of its domain should cost no more than plain decoding.

A speculative round costs more than a plain decoding step (drafting, a wider verifier call, committing), so it pays
only while its rounds emit more tokens than that cost ratio: the break-even τ, from the costs `--tree auto` measured.
The gate keeps a running estimate of the tokens a speculative round emits; while it is below break-even, rounds
decode plainly (the root alone is verified: no drafter is consulted), and one speculative round probes again after
a wait that doubles while probes keep failing. The drafters catch up on the skipped positions in one batched pass
when they next draft (`DrafterState`). Every round is verified as usual, so the gate changes how fast the output
comes, never what it is.
"""

from dataclasses import dataclass

from taps_train.errors import TapsError


@dataclass(frozen=True)
class GateConfig:
    break_even: float  # tokens a speculative round must emit on average to beat a plain decoding step
    expected: float  # the estimate every generation starts from (the calibration's expected τ)
    smoothing: float = 0.3  # weight of the newest round in the running estimate
    first_wait: int = 4  # plain rounds before the first probe
    longest_wait: int = 32  # the wait stops doubling here

    def __post_init__(self):
        if not (self.break_even > 0 and self.expected > 0 and 0 < self.smoothing <= 1 and 1 <= self.first_wait <= self.longest_wait):
            raise TapsError(f"speculation gate settings out of range: {self}")

    def as_dict(self) -> dict:
        return {"break_even_tau": round(self.break_even, 4), "expected_tau": round(self.expected, 4), "smoothing": self.smoothing,
                "first_wait": self.first_wait, "longest_wait": self.longest_wait}


class Gate:
    """One generation's gate: `speculate()` before a round, `observe()` after each speculative one."""

    def __init__(self, config: GateConfig):
        self.config = config
        self.estimate = config.expected
        self.waiting = 0  # plain rounds left before the next probe
        self.next_wait = config.first_wait

    def speculate(self) -> bool:
        if self.waiting:
            self.waiting -= 1
            return False
        return True

    def observe(self, emitted: int) -> None:
        """A speculative round emitted `emitted` tokens (accepted draft tokens + the verifier's own)."""
        self.estimate += self.config.smoothing * (emitted - self.estimate)
        if self.estimate >= self.config.break_even:
            self.next_wait = self.config.first_wait
        else:
            self.waiting = self.next_wait
            self.next_wait = min(2 * self.next_wait, self.config.longest_wait)
