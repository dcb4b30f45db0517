"""Figures of the NAM paper (seed 000) that the library checks itself against.

:data:`PAPER_PARAMS`: Table 1's parameter counts, keyed by the backbone that runs each column
(``memnets.models.seq.BACKBONES``; the ``paper/<task>-<backbone>`` presets are sized to them,
tests/test_paper_presets_sizes.py). Table 1's accuracies are ``memnets.cli.table.PAPER_TABLE1``.
"""
from __future__ import annotations

__all__ = ["PAPER_PARAMS"]

# Table 1, row "Parameters": TF 28.7M, LSTM 31.5M, UT 26.0M, DNC 40.2M, LSAM 25.8M, NAM-TM 23.3M, No Jmp 22.2M.
PAPER_PARAMS: dict[str, int] = {
    "transformer": 28_700_000,            # TF
    "lstm_attention": 31_500_000,         # LSTM
    "universal_transformer": 26_000_000,  # UT
    "dnc": 40_200_000,                    # DNC
    "lsam_encdec": 25_800_000,            # LSAM
    "nam_tm": 23_300_000,                 # NAM-TM
    "nam_tm_nojmp": 22_200_000,           # No Jmp
}
