"""Token-sequence model for the masked-completion tasks of Table 1 (docs/maths.md §10-§12).

``tokens [B, W] → Embedding → backbone → head → logits [B, W, vocab]`` (head: one Linear, or
with ``head="mlp"`` LayerNorm → Dropout → ReLU → Linear); every position is
predicted in one pass. The backbone is chosen by name from :data:`BACKBONES`; modules that
are not installed are reported by :func:`backbone_available` instead of failing at import.
Backbones that return a tensor and backbones that return ``(y, state)`` are both handled.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import nn

from .._checks import check_tensor
from ..registry import register_model
from ..ops._amp import run_rnn

__all__ = ["SequenceTaskModel", "BACKBONES", "SIZES", "RENAMED_BACKBONES", "backbone_available", "build_backbone",
           "canonical_backbone"]


def _kw(**fixed: Any) -> Callable[[int, dict], dict]:
    """Constructor kwargs: the fixed ones (which may name ``d`` via the key ``"@d"``) + user kwargs."""

    def make(d: int, user: dict) -> dict:
        out = {k: (d if v == "@d" else v) for k, v in fixed.items()}
        out.update(user)
        return out

    return make


# name -> (module, class, kwargs builder, paper column label)
BACKBONES: dict[str, tuple[str, str, Callable[[int, dict], dict], str]] = {
    "lsam_stack": ("memnets.memories.lsam", "LSAM", _kw(input_size="@d", hidden_size="@d"), "LSAM (stack)"),
    "lsam_encdec": ("memnets.models.lsam_seq2seq", "LSAMEncoderDecoder", _kw(d_model="@d"), "LSAM"),
    "nam_tm": ("memnets.memories.nam_tm", "NAMTuringMachine", _kw(input_size="@d", hidden_size="@d"), "NAM-TM"),
    "nam_tm_nojmp": ("memnets.memories.nam_tm", "NAMTuringMachine",
                     _kw(input_size="@d", hidden_size="@d", actions=("LEFT", "NOOP", "RIGHT")), "No Jmp"),
    "transformer": ("memnets.models.transformer", "TransformerEncoder", _kw(d_model="@d"), "TF"),
    "universal_transformer": ("memnets.models.transformer", "UniversalTransformer", _kw(d_model="@d"), "UT"),
    "lstm_attention": ("memnets.models.lstm_baseline", "LSTMAttentionBaseline", _kw(d_model="@d"), "LSTM"),
    "dnc": ("memnets.memories.dnc", "DNC", _kw(input_size="@d", output_size="@d"), "DNC"),
    "ntm": ("memnets.memories.ntm", "NTM", _kw(input_size="@d", output_size="@d"), "NTM"),
    "bilstm": ("torch.nn", "LSTM", _kw(), "biLSTM"),
}

# former backbone names, still accepted with a FutureWarning (:func:`canonical_backbone`): the name
# of each backbone says what it is, and its label in the tables matches it
RENAMED_BACKBONES = {"lstm": "bilstm", "lsam": "lsam_stack"}


def canonical_backbone(name: str, warn: bool = True) -> str:
    """The current name of backbone ``name`` (a former name, :data:`RENAMED_BACKBONES`, gives
    the new one, with a FutureWarning when ``warn``); any other name is returned as it is."""
    new = RENAMED_BACKBONES.get(name)
    if new is None:
        return name
    if warn:
        import warnings

        warnings.warn(f"backbone {name!r} is now named {new!r} (label {BACKBONES[new][3]!r}); the old name "
                      "will go", FutureWarning, stacklevel=3)
    return new

class _BySize(dict):
    """Backbone name → sizes; a former backbone name (:data:`RENAMED_BACKBONES`) finds its entry."""

    def __missing__(self, key: str) -> dict[str, Any]:
        if key in RENAMED_BACKBONES:
            return self[RENAMED_BACKBONES[key]]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, RENAMED_BACKBONES.get(key, key) if isinstance(key, str) else key)


# Backbone sizes: "tiny" (tests, < 0.1 M), "small" (CPU presets, ~0.1-1 M), "paper" (docs/maths.md §12).
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": _BySize({
        "lsam_stack": {"d_model": 32, "num_heads": 4, "num_layers": 1, "bidirectional": True},
        "lsam_encdec": {"d_model": 32, "num_heads": 4, "dim_feedforward": 64},
        "nam_tm": {"d_model": 32, "num_tapes": 2, "tape_length": 32},
        "nam_tm_nojmp": {"d_model": 32, "num_tapes": 2, "tape_length": 32},
        "transformer": {"d_model": 32, "num_layers": 2, "num_heads": 4, "dim_feedforward": 64, "max_len": 64},
        "universal_transformer": {"d_model": 32, "num_heads": 4, "num_steps": 2, "max_len": 64},
        "lstm_attention": {"d_model": 32, "num_layers": 2},
        "dnc": {"d_model": 32, "memory_slots": 16, "word_size": 16, "read_heads": 2, "controller_size": 32},
        "ntm": {"d_model": 32, "memory_slots": 16, "word_size": 16, "controller_size": 32},
        "bilstm": {"d_model": 32, "num_layers": 2},
    }),
    "small": _BySize({  # CPU presets: d_model 64-128, ~0.05-0.5 M parameters
        "lsam_stack": {"d_model": 64, "num_heads": 4, "num_layers": 2, "bidirectional": True},
        "lsam_encdec": {"d_model": 64, "num_heads": 4, "dim_feedforward": 128},
        "nam_tm": {"d_model": 64, "num_tapes": 4, "tape_length": 32},
        "nam_tm_nojmp": {"d_model": 64, "num_tapes": 4, "tape_length": 32},
        "transformer": {"d_model": 64, "num_layers": 3, "num_heads": 4, "dim_feedforward": 128, "max_len": 64},
        "universal_transformer": {"d_model": 64, "num_heads": 4, "num_steps": 4, "transition": "conv",
                                  "dim_feedforward": 64, "input_projection": True, "final_norm": False},
        "lstm_attention": {"d_model": 128, "num_layers": 2},
        "dnc": {"d_model": 64, "memory_slots": 32, "word_size": 32, "read_heads": 4, "controller_size": 128,
                "controller_layers": 2},
        "ntm": {"d_model": 64, "memory_slots": 32, "word_size": 32, "controller_size": 128},
        "bilstm": {"d_model": 128, "num_layers": 2},
    }),
    "paper": _BySize({  # the paper/* presets: docs/maths.md §12 sizes, free widths set to Table 1's counts (memnets.paper)
        "lsam_stack": {"d_model": 1024, "num_heads": 8, "num_layers": 2, "bidirectional": True},
        "lsam_encdec": {"d_model": 1024, "num_heads": 8, "dim_feedforward": 6144},
        "nam_tm": {"d_model": 1200, "num_tapes": 8, "tape_length": 32, "num_layers": 2},
        "nam_tm_nojmp": {"d_model": 1344, "num_tapes": 8, "tape_length": 32, "num_layers": 2},
        "transformer": {"d_model": 512, "num_layers": 8, "num_heads": 8, "dim_feedforward": 2560, "max_len": 64},
        "universal_transformer": {"d_model": 1536, "num_heads": 24, "num_steps": 8, "transition": "conv",
                                  "dim_feedforward": 1536, "input_projection": True, "final_norm": False},
        "lstm_attention": {"d_model": 1448, "num_layers": 2},
        "dnc": {"d_model": 512, "memory_slots": 32, "word_size": 768, "read_heads": 8, "controller_size": 816,
                "controller_layers": 2},
        "ntm": {"d_model": 512, "memory_slots": 128, "word_size": 64},
        "bilstm": {"d_model": 1024, "num_layers": 2},
    }),
}


def backbone_available(name: str) -> tuple[bool, str]:
    """``(True, "")`` when backbone ``name`` can be built here, else ``(False, reason)``."""
    name = canonical_backbone(name, warn=False)
    if name not in BACKBONES:
        return False, f"unknown backbone {name!r}; expected one of {sorted(BACKBONES)}"
    module, cls, _, _ = BACKBONES[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        return False, f"module {module} is not available ({e})"
    if not hasattr(mod, cls):
        return False, f"{module} has no {cls}"
    return True, ""


class _BiLSTM(nn.Module):
    """Bidirectional ``torch.nn.LSTM`` with ``d_model // 2`` units per direction: ``[B,T,d] → [B,T,d]``."""

    def __init__(self, d_model: int, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"`d_model` expected an even number for the biLSTM, got {d_model}")
        self.lstm = nn.LSTM(d_model, d_model // 2, num_layers=num_layers, batch_first=True,
                            bidirectional=True, dropout=dropout if num_layers > 1 else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_rnn(self.lstm, x)[0]


def build_backbone(name: str, d_model: int, **kwargs: Any) -> nn.Module:
    """Construct backbone ``name`` mapping ``[B, T, d_model] → [B, T, d_model]``.

    Raises ValueError (unknown name) or ImportError (module not available) with the reason.
    """
    name = canonical_backbone(name)
    ok, why = backbone_available(name)
    if not ok:
        if name not in BACKBONES:
            raise ValueError(f"`backbone` {why}")
        raise ImportError(f"backbone {name!r} cannot be built: {why}")
    if name == "bilstm":
        return _BiLSTM(d_model, **kwargs)
    module, cls, make, _ = BACKBONES[name]
    return getattr(importlib.import_module(module), cls)(**make(d_model, dict(kwargs)))


@register_model("seq")
class SequenceTaskModel(nn.Module):
    """Embedding → backbone → head: token ids ``[B, W]`` (0 ≤ id < vocab) → logits ``[B, W, vocab]``.

    Args:
        backbone: a key of :data:`BACKBONES` (``"nam_tm"``, ``"transformer"``, ``"bilstm"``, ...).
        vocab_size: number of token ids (16 for the NSP tasks, docs/maths.md §12).
        d_model: embedding width, also the backbone's input and output width.
        head: ``"linear"`` (default): one Linear to the vocabulary. ``"mlp"``: the authors'
            NAM-TM output block (docs/maths.md §12 code), LayerNorm → Dropout → ReLU → Linear. A NAM-TM's
            output is linear in what it reads, and a linear head on it is additive in the
            digits read, which cannot give ``(a + b) mod 10``: Fib needs ``"mlp"`` (docs/fib.md).
        head_dropout: the Dropout probability of the ``"mlp"`` head (the authors': 0.1).
        **backbone_kwargs: passed to the backbone constructor (e.g. ``num_heads=4``).

    Example::

        model = SequenceTaskModel("bilstm", d_model=32, num_layers=1)
        logits = model(torch.zeros(2, 9, dtype=torch.long))   # [2, 9, 16]
    """

    def __init__(self, backbone: str, vocab_size: int = 16, d_model: int = 64, head: str = "linear",
                 head_dropout: float = 0.0, **backbone_kwargs: Any) -> None:
        super().__init__()
        if head not in ("linear", "mlp"):
            raise ValueError(f"`head` expected 'linear' or 'mlp', got {head!r}")
        if not 0.0 <= float(head_dropout) < 1.0:
            raise ValueError(f"`head_dropout` expected a probability in [0, 1), got {head_dropout!r}")
        backbone = canonical_backbone(backbone)
        self.backbone_name = backbone
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.backbone = build_backbone(backbone, d_model, **backbone_kwargs)
        if head == "mlp":
            self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Dropout(float(head_dropout)), nn.ReLU(),
                                      nn.Linear(d_model, vocab_size))
        else:
            self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"`tokens` expected int64 [B, W], got {tokens.dtype} {list(tokens.shape)}")
        x = self.embed(tokens)  # [B, W, d]
        out = self.backbone(x)
        y = out[0] if isinstance(out, tuple) else out  # (y, state) or y
        if y.shape[:2] != tokens.shape or y.shape[-1] != self.d_model:
            raise ValueError(f"backbone {self.backbone_name!r} returned {list(y.shape)}, "
                             f"expected [B, W, d_model] = {[*tokens.shape, self.d_model]}")
        return self.head(y)
