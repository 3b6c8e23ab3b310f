"""`taps-train study`: the TAPS comparison (specialists, mixtures, compositions) as one resumable command."""

from taps_train.study.config import Domain, Study, Tree
from taps_train.study.run import run_study

__all__ = ["Domain", "Study", "Tree", "run_study"]
