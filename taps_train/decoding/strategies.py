"""Which tree a round verifies when several drafters propose: the strategy registry of `taps-train eval`.

`average` is not here: it combines drafters in weight space before decoding (see
`taps_train.drafter.average`) and then decodes with `single`.
"""

from taps_train.decoding.compose import (
    merge,
    merge_budget,
    merge_union,
    route_confidence,
    route_entropy,
)
from taps_train.decoding.decoder import Strategy, single

STRATEGIES: dict[str, Strategy] = {
    "single": single,
    "route-confidence": route_confidence,
    "route-entropy": route_entropy,
    "merge": merge,
    "merge-union": merge_union,
    "merge-budget": merge_budget,
}
