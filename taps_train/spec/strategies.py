"""Which tree a round verifies when several drafters propose: the strategy registry of `taps-train eval`."""

from taps_train.spec.decoder import Strategy, single

STRATEGIES: dict[str, Strategy] = {"single": single}
