"""Export drafters as the draft-model directories serving engines load, and read them back.

One module per layout (`sglang.py`: `--format eagle`, `vllm.py`, `speculators.py`), each registering a `Layout`;
`source.py` reads the checkpoints and the verifier they must fit, `drafter.py` writes one drafter through a layout,
`bundle.py` a composition of several, `reader.py` reads any of them back, `directory.py` keeps the output directory
whole. A new layout is one module here, imported below.
"""

from taps_train.export import sglang, speculators, vllm  # noqa: F401  (registers the layouts)
from taps_train.export.bundle import BUNDLE_STRATEGIES, export_bundle
from taps_train.export.drafter import export_drafter
from taps_train.export.layout import LAYOUTS, Layout, register, serving_config
from taps_train.export.reader import load_exported

__all__ = ["BUNDLE_STRATEGIES", "LAYOUTS", "Layout", "export_bundle", "export_drafter", "load_exported", "register", "serving_config"]
