"""The LRA model sizes, kept here for the benchmarks that read them; the LRA runs train through
``memnets train lra/...`` (:mod:`memnets.train.families.lra`, docs/lra.md)."""
from ..models.lra import LRAClassifier
from ..train.families.lra import PRESETS

__all__ = ["LRAClassifier", "PRESETS"]
