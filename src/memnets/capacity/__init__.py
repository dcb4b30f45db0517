"""Associative-memory capacity lab (docs/maths.md §1, §6; Schlag, Irie & Schmidhuber 2021, Sec. 4).

Trains every memory of memnets with the same projection widths on key–value retrieval
(setting 1: capacity; setting 2: edits) and on multi-query associative recall, and reports
loss / accuracy as the number of stored pairs grows. ``memnets capacity`` runs the sweep.
"""
from .adapters import DEFAULT_MEMORIES, MEMORIES, build_adapter, unavailable_reason
from .harness import MQARConfig, RetrievalConfig, RetrievalModel, TokenModel, train_mqar, train_retrieval

__all__ = ["MEMORIES", "DEFAULT_MEMORIES", "build_adapter", "unavailable_reason", "RetrievalConfig",
           "MQARConfig", "RetrievalModel", "TokenModel", "train_retrieval", "train_mqar"]
