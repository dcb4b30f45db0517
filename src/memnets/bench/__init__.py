"""Benchmarks: ``memnets bench <suite>`` times implementations in one process, reports ratios."""
from .registry import SUITES, run_suite, format_table

__all__ = ["SUITES", "run_suite", "format_table"]
