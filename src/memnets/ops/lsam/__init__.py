"""LSAM ops (docs/maths.md §2): :func:`lsam_scan`, the fused layer recurrence
(:mod:`~memnets.ops.lsam.recurrence`, loops in :mod:`~memnets.ops.lsam.loops`), and its
reference :func:`lsam_scan_reference` / :func:`lsam_cell_step` (:mod:`~memnets.ops.lsam.reference`).
"""
from .recurrence import LSAMRecurrence, lsam_scan
from .reference import lsam_cell_step, lsam_scan_reference

__all__ = ["lsam_scan", "lsam_scan_reference", "lsam_cell_step", "LSAMRecurrence"]
