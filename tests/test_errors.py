"""Every row of the table in docs/errors.md, triggered and checked.

The table is parsed from the Markdown file, so a row without a case here, or a case without a
row there, fails the test: the documentation and the behaviour cannot drift apart. Each row
names the exception (or ``exit 2`` for the command line) and an excerpt of its message.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import memnets
from memnets import ops
from memnets.registry import build_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
t = torch.randn
L = torch.long


def _rows() -> list[dict[str, str]]:
    """The rows of the first table under '## Error table' (id · entry · bad input · exception · excerpt)."""
    text = DOC.read_text()
    section = text.split("## Error table", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, f"malformed row in {DOC.name}: {line}"
        rows.append({"id": cells[0].strip("`"), "entry": cells[1], "bad": cells[2],
                     "exc": cells[3].strip("`"), "excerpt": cells[4]})
    return rows


def _ntm(**kw):
    return build_model("ntm", input_size=3, output_size=3, memory_slots=8, **kw)


def _dnc(**kw):
    return build_model("dnc", input_size=3, output_size=3, **kw)


def _memn2n(**kw):
    return build_model("memn2n", vocab_size=10, sentence_size=4, **kw)


def _namtm(**kw):
    return build_model("nam_tm", input_size=3, hidden_size=4, **kw)


def _lsam(**kw):
    return build_model("lsam", input_size=3, hidden_size=4, num_heads=2, **kw)


def _fw(**kw):
    return build_model("fast_weights", input_size=4, **kw)


def _packed(width: int):
    """Two sequences of lengths 3 and 2 as a PackedSequence (5 steps of ``width`` features)."""
    return torch.nn.utils.rnn.pack_sequence([torch.zeros(3, width), torch.zeros(2, width)])


def _with_state(model, x, batch):
    return model(x, model.init_state(batch))


def _cfg(*overrides):
    return memnets.train.load_config("cpu/reduce-lstm", list(overrides))


def _babi_truncated(tmp_path):
    from memnets.tasks import babi

    try:
        src = babi.archive_path()
    except FileNotFoundError:  # pragma: no cover - no data directory on this machine
        pytest.skip("bAbI archive not available")
    dst = tmp_path / babi.ARCHIVE
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes()[:20000])
    return babi.load_task(1, data_dir=tmp_path)


def _pretrained_truncated(tmp_path):
    from memnets.pretrained import WEIGHTS_NAME, load_pretrained, save_pretrained

    save_pretrained(_lsam(), tmp_path / "m")
    w = tmp_path / "m" / WEIGHTS_NAME
    w.write_bytes(w.read_bytes()[:50])
    return load_pretrained(tmp_path / "m")


def _fake_run(tmp_path) -> str:
    """A run directory with a valid config.json and a truncated best.safetensors."""
    import json

    from memnets.train import config_to_dict

    cfg = memnets.train.load_config("cpu/reduce-lstm", ["model.d_model=8"])
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config_to_dict(cfg)))
    (run / "checkpoints" / "best.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    return str(run)


def _torn_pointer(tmp_path):
    from memnets.train.checkpoint import load_checkpoint

    (tmp_path / "last.json").write_text('{"step": 8, "weights": ')
    return load_checkpoint(tmp_path, torch.nn.Linear(1, 1))


def _check_finite_nan(tmp_path):
    from memnets.train.nan_guard import check_finite

    m = torch.nn.Linear(2, 2)
    with torch.no_grad():
        m.bias[1] = float("nan")
    return check_finite(torch.tensor(1.0), m, step=7)


CASES = {
    # ops.nam
    "unit-not-tensor": lambda p: ops.unit([1.0, 2.0]),
    "nam_read-M-rank": lambda p: ops.nam_read(t(4), t(4)),
    "nam_read-q-shape": lambda p: ops.nam_read(t(2, 3, 4), t(2, 5)),
    "nam_read-p_r-shape": lambda p: ops.nam_read(t(2, 3, 4), t(2, 4), p_r=t(3)),
    "nam_write-k-shape": lambda p: ops.nam_write(t(2, 3, 4), t(2, 5), t(2, 3)),
    "nam_write-v-shape": lambda p: ops.nam_write(t(2, 3, 4), t(2, 4), t(2, 2)),
    "split_heads-indivisible": lambda p: ops.split_heads(t(2, 5), 2),
    # ops.delta
    "nam_scan-q-rank": lambda p: ops.nam_scan(t(2, 3, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.0, 1.0),
    "nam_scan-v-shape": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 2, 1, 4), 1.0, 1.0),
    "nam_scan-empty-T": lambda p: ops.nam_scan(t(2, 0, 1, 4), t(2, 0, 1, 4), t(2, 0, 1, 4), 1.0, 1.0),
    "nam_scan-batch-0": lambda p: ops.nam_scan(t(0, 3, 1, 4), t(0, 3, 1, 4), t(0, 3, 1, 4), 1.0, 1.0),
    "nam_scan-int-dtype": lambda p: ops.nam_scan(*(torch.ones(2, 3, 1, 4, dtype=L),) * 3, 1.0, 1.0),
    "nam_scan-dtype-mix": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4),
                                                 t(2, 3, 1, 4, dtype=torch.float64), 1.0, 1.0),
    "nam_scan-state-shape": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.0, 1.0,
                                                   initial_state=t(2, 4, 4)),
    "nam_scan-state-dtype": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.0, 1.0,
                                                   initial_state=t(2, 1, 4, 4, dtype=torch.float64)),
    "nam_scan-p_w-shape": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3), 1.0),
    "nam_scan-p_w-int": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4),
                                               torch.ones(2, 3, 1, dtype=L), 1.0),
    "nam_scan-p_w-missing": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), None, 1.0),
    "nam_scan-impl": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.0, 1.0, impl="bogus"),
    "nam_scan-chunk_size": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.0, 1.0,
                                                  impl="chunked", chunk_size=0),
    "nam_scan-validate-p_w-float": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4), 1.5, 1.0,
                                                          validate=True),
    "nam_scan-validate-p_w-range": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4),
                                                          torch.full((2, 3, 1), -0.1), 1.0, validate=True),
    "nam_scan-validate-nan": lambda p: ops.nam_scan(torch.full((2, 3, 1, 4), float("nan")), t(2, 3, 1, 4),
                                                    t(2, 3, 1, 4), 1.0, 1.0, validate=True),
    "nam_step-validate-p_e": lambda p: ops.nam_step(t(2, 1, 4), t(2, 1, 4), t(2, 1, 4), 1.0, torch.full((2, 1), 3.0),
                                                    validate=True),
    "nam_step-state-shape": lambda p: ops.nam_step(t(2, 1, 4), t(2, 1, 4), t(2, 1, 4), 1.0, 1.0,
                                                   initial_state=t(2, 1, 4, 3)),
    # ops.attention
    "nam_attention-rank": lambda p: ops.nam_attention(t(4), t(3, 4), t(3, 4)),
    "nam_attention-dk": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 5), t(2, 3, 4)),
    "nam_attention-S": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), t(2, 5, 4)),
    "nam_attention-dtype-mix": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4, dtype=torch.float64)),
    "nam_attention-device-mix": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), torch.empty(2, 3, 4, device="meta")),
    "linear_attention-int": lambda p: ops.linear_attention(*(torch.ones(2, 3, 4, dtype=L),) * 3),
    "nam_scan-device-mix": lambda p: ops.nam_scan(t(2, 3, 1, 4), t(2, 3, 1, 4), torch.empty(2, 3, 1, 4, device="meta"),
                                                  1.0, 1.0),
    "nam_attention-causal-L": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 5, 4), t(2, 5, 4), causal=True),
    "nam_attention-attn_mask": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4),
                                                           attn_mask=torch.ones(3, 3, dtype=torch.bool)),
    "nam_attention-dropout": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4), dropout_p=0.1),
    "nam_attention-causal-conflict": lambda p: ops.nam_attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4), is_causal=True,
                                                                 causal=False),
    "linear_attention-causal-L": lambda p: ops.linear_attention(t(2, 3, 4), t(2, 5, 4), t(2, 5, 4), causal=True),
    # ops.addressing (NTM)
    "content_weights-strength": lambda p: ops.content_weights(t(2, 8, 4), t(2, 1, 4), t(2, 3)),
    "cosine_similarity-key": lambda p: ops.cosine_similarity(t(2, 8, 4), t(2, 1, 5)),
    "cosine_similarity-memory": lambda p: ops.cosine_similarity(t(8), t(2, 1, 5)),
    "interpolate-w_prev": lambda p: ops.interpolate(t(2, 8), t(2, 7), 0.5),
    "circular_shift-s": lambda p: ops.circular_shift(t(2, 8), t(3, 3)),
    "circular_shift-wide": lambda p: ops.circular_shift(t(2, 3), t(2, 5)),
    "sharpen-not-tensor": lambda p: ops.sharpen([0.5, 0.5], 2.0),
    "erase_add_write-erase": lambda p: ops.erase_add_write(t(2, 8, 4), t(2, 1, 8), t(2, 1, 3), t(2, 1, 4)),
    # ops.dnc
    "dnc_allocation-scalar": lambda p: ops.dnc_allocation(torch.tensor(0.5)),
    "dnc_directional-link": lambda p: ops.dnc_directional_weights(t(2, 8, 7), t(2, 1, 8)),
    "dnc_retention-rank": lambda p: ops.dnc_retention(t(2, 1), t(8)),
    # registry
    "build_model-unknown": lambda p: build_model("no_such_model"),
    # NTM
    "ntm-memory_slots": lambda p: build_model("ntm", input_size=3, output_size=3, memory_slots=0),
    "ntm-controller": lambda p: _ntm(controller="gru"),
    "ntm-write_gate_bias": lambda p: _ntm(write_gate_bias=float("nan")),
    "ntm-batch-0": lambda p: _ntm().init_state(0),
    "ntm-x-size": lambda p: _ntm()(t(2, 5, 4)),
    "ntm-x-rank": lambda p: _ntm()(t(5, 3)),
    "ntm-x-empty": lambda p: _ntm()(t(2, 0, 3)),
    "ntm-x-dtype": lambda p: _ntm()(t(2, 4, 3, dtype=torch.float64)),
    "ntm-shift_range": lambda p: build_model("ntm", input_size=3, output_size=3, memory_slots=2, shift_range=2),
    "ntm-state-batch": lambda p: _with_state(_ntm(), t(2, 5, 3), 3),
    # DNC
    "dnc-impl": lambda p: _dnc(impl="x"),
    "dnc-batch-0": lambda p: _dnc().init_state(0),
    "dnc-x-size": lambda p: _dnc()(t(2, 5, 4)),
    "dnc-x-empty": lambda p: _dnc()(t(2, 0, 3)),
    "dnc-x-dtype": lambda p: _dnc()(torch.ones(2, 4, 3, dtype=L)),
    "dnc-state-batch": lambda p: _with_state(_dnc(), t(2, 5, 3), 3),
    # MemN2N
    "memn2n-vocab_size": lambda p: build_model("memn2n", vocab_size=1, sentence_size=4),
    "memn2n-impl": lambda p: _memn2n(impl="x"),
    "memn2n-float-ids": lambda p: _memn2n()(t(2, 3, 4), torch.zeros(2, 4, dtype=L)),
    "memn2n-stories-rank": lambda p: _memn2n()(torch.zeros(2, 4, dtype=L), torch.zeros(2, 4, dtype=L)),
    "memn2n-memory_size": lambda p: _memn2n(memory_size=3)(torch.zeros(2, 5, 4, dtype=L), torch.zeros(2, 4, dtype=L)),
    "memn2n-query-batch": lambda p: _memn2n()(torch.zeros(2, 3, 4, dtype=L), torch.zeros(3, 4, dtype=L)),
    "memn2n-batch-0": lambda p: _memn2n()(torch.zeros(0, 3, 4, dtype=L), torch.zeros(0, 4, dtype=L)),
    "memn2n-token-range": lambda p: _memn2n()(torch.full((2, 3, 4), 12, dtype=L), torch.zeros(2, 4, dtype=L)),
    # NAM-TM
    "nam_tm-x-size": lambda p: _namtm()(t(2, 5, 4)),
    "nam_tm-tape_length": lambda p: _namtm(tape_length=0),
    "nam_tm-forward-tape_length": lambda p: _namtm()(t(2, 5, 3), tape_length=0),
    "nam_tm-hidden-odd": lambda p: build_model("nam_tm", input_size=3, hidden_size=5),
    "nam_tm-empty-T": lambda p: _namtm()(t(2, 0, 3)),
    "nam_tm-batch-0": lambda p: _namtm().init_state(0),
    "nam_tm-state-batch": lambda p: _with_state(_namtm(), t(2, 5, 3), 3),
    # LSAM
    "lsam-x-size": lambda p: _lsam()(t(2, 5, 4)),
    "lsam-heads": lambda p: build_model("lsam", input_size=3, hidden_size=5, num_heads=2),
    "lsam-empty-T": lambda p: _lsam()(t(2, 0, 3)),
    "lsam-batch-0": lambda p: _lsam().init_state(0),
    "lsam-state-batch": lambda p: _with_state(_lsam(), t(2, 5, 3), 3),
    "lsam-x-dtype": lambda p: _lsam()(t(2, 5, 3, dtype=torch.float64)),
    "lsam-packed-size": lambda p: _lsam()(_packed(4)),
    "dnc-packed-aux": lambda p: _dnc()(_packed(3), return_aux=True),
    "fast_weights-packed-mask": lambda p: _fw()(_packed(4), mask=torch.ones(2, 3, dtype=torch.bool)),
    "nam_tm-packed-noop": lambda p: _namtm(actions=("LEFT", "RIGHT", "JUMP"))(_packed(3)),
    # fast weights
    "fast_weights-x-size": lambda p: _fw()(t(2, 5, 3)),
    "fast_weights-empty-T": lambda p: _fw()(t(2, 0, 4)),
    "fast_weights-x-dtype": lambda p: _fw()(t(2, 5, 4, dtype=torch.float64)),
    "fast_weights-rule": lambda p: _fw(update_rule="x"),
    "fast_weights-batch-0": lambda p: _fw().init_state(0),
    "fast_weights-state-batch": lambda p: _with_state(_fw(), t(2, 5, 4), 3),
    # few-shot, conv4
    "nam_fewshot-x": lambda p: build_model("nam_fewshot", feature_dim=4, num_base_classes=3)(t(2, 5)),
    "conv4-x": lambda p: build_model("conv4")(t(2, 3, 28)),
    # data
    "babi-task": lambda p: memnets.tasks.babi.load_task(21),
    "babi-split": lambda p: memnets.tasks.babi.load_task(1, split="dev"),
    "babi-data_dir": lambda p: memnets.tasks.babi.load_task(1, data_dir="/nonexistent"),
    "babi-bad-line": lambda p: memnets.tasks.babi.parse_babi(["hello world"], 1),
    "babi-truncated": _babi_truncated,
    "pretrained-truncated": _pretrained_truncated,
    # training config
    "config-unknown-key": lambda p: _cfg("optim.lrr=1"),
    "config-remove-fixed": lambda p: _cfg("~seed"),
    "config-remove-absent": lambda p: _cfg("~model.options.zz"),
    "config-type": lambda p: _cfg("epochs=abc"),
    "config-no-equals": lambda p: _cfg("epochs"),
    "config-preset": lambda p: memnets.train.load_config("cpu/reduce-lstmm"),
    "config-epochs-0": lambda p: _cfg("epochs=0"),
    "config-choice": lambda p: _cfg("schedule.kind=linear"),
    "config-batch-vs-train": lambda p: _cfg("batch_size=100000"),
    "config-digits": lambda p: _cfg("task.train_digits=[3,1]"),
    "config-select_split": lambda p: _cfg("select_split=zzz"),
    "config-table": lambda p: _cfg("optim=3"),
    "config-lr-nan": lambda p: _cfg("optim.lr=nan"),
    "config-device": lambda p: _cfg("device=tpu"),
    "config-nan_policy": lambda p: _cfg("optim.nan_policy=warn"),
    "config-spike_skip": lambda p: _cfg("optim.spike_skip=-1"),
    "config-replaced-table": lambda p: _cfg("model=0", "model.backbone=lstm"),
    "checkpoint-torn-pointer": _torn_pointer,
    "config-backbone": lambda p: memnets.train.build_model(_cfg("model.backbone=nope")),
    "config-toml-syntax": lambda p: (p / "bad.toml").write_text("epochs = [") and memnets.train.load_config(p / "bad.toml"),
    # NaN guard
    "check_finite-policy": lambda p: memnets.train.nan_guard.check_finite(1.0, policy="warn"),
    "check_finite-nan-param": _check_finite_nan,
    "DeviceGuard-factor": lambda p: memnets.train.step_guard.DeviceGuard(-1.0, "cpu"),
    "DeviceGuard-not-fused": lambda p: memnets.train.step_guard.DeviceGuard(10.0, "cpu").attach(
        torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])),
    # command line
    "cli-train-preset": ["train", "cpu/no-such-preset"],
    "cli-train-override": ["train", "cpu/reduce-lstm", "optim.lrr=1"],
    "cli-configs-show": ["configs", "show", "zzz"],
    "cli-eval-not-run": ["eval", "{tmp}"],
    "cli-unknown-command": ["frobnicate"],
    "cli-viz-corrupt-weights": ["viz", "{run}", "--out", "{tmp}/viz"],
    "cli-eval-corrupt-weights": ["eval", "{run}"],
    "cli-train-device": ["train", "cpu/reduce-lstm", "device=tpu"],
    "cli-bench-suite": ["bench", "zzz"],
    "cli-train-override-alias": ["train", "cpu/reduce-lstm", "optim.learning_rate=1"],
    "cli-configs-show-no-preset": ["configs", "show"],
    "cli-viz-no-args": ["viz"],
    "cli-table-not-run": ["table", "{tmp}"],
    "cli-report-not-run": ["report", "{tmp}", "--out", "{tmp}/report.html"],
}

import memnets.tasks.babi  # noqa: E402  (for the lambdas above)
import memnets.train.nan_guard  # noqa: E402

ROWS = _rows()


def test_validate_accepts_good_values_and_is_off_by_default():
    q, k, v = t(2, 3, 1, 4), t(2, 3, 1, 4), t(2, 3, 1, 4)
    p = torch.rand(2, 3, 1)
    a = ops.nam_scan(q, k, v, p, p, p, validate=True)
    b = ops.nam_scan(q, k, v, p, p, p)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ops.nam_scan(q, k, v, 1.5, 1.0)  # β > 1 is allowed unless validate=True asks otherwise


def test_table_and_cases_match():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids)), "duplicate ids in docs/errors.md"
    assert set(ids) == set(CASES), (sorted(set(ids) - set(CASES)), sorted(set(CASES) - set(ids)))


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_error_row(row, tmp_path, capsys):
    case = CASES[row["id"]]
    if isinstance(case, list):
        from memnets.cli.main import main

        assert row["exc"] == "exit 2"
        run = _fake_run(tmp_path) if any("{run}" in a for a in case) else ""
        argv = [a.replace("{tmp}", str(tmp_path)).replace("{run}", run) for a in case]
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        assert rc == 2
        err = capsys.readouterr().err
        assert row["excerpt"] in err, err
        assert "Traceback" not in err
        return
    exc_type = _exception_class(row["exc"])
    with pytest.raises(exc_type) as info:
        case(tmp_path)
    assert row["excerpt"] in str(info.value), str(info.value)


def _exception_class(name: str) -> type:
    import builtins

    if hasattr(builtins, name):
        return getattr(builtins, name)
    from memnets.train import ConfigError
    from memnets.train.nan_guard import NonFiniteError

    return {"ConfigError": ConfigError, "NonFiniteError": NonFiniteError}[name]



# Cases that were once gaps, kept beside their table rows with a few more inputs.
@pytest.mark.parametrize("where", ["ntm", "circular_shift"])
def test_shift_wider_than_memory_is_refused(where):
    with pytest.raises(ValueError):
        if where == "ntm":
            build_model("ntm", input_size=3, output_size=3, memory_slots=2, shift_range=2)
        else:
            ops.circular_shift(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("name", ["ntm", "dnc"])
def test_empty_sequence_is_refused_by_ntm_and_dnc(name):
    model = _ntm() if name == "ntm" else _dnc()
    with pytest.raises(ValueError):
        model(t(2, 0, 3))


@pytest.mark.parametrize("name", ["ntm", "dnc"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.long])
def test_ntm_dnc_input_dtype_is_checked(name, dtype):
    model = _ntm() if name == "ntm" else _dnc()
    with pytest.raises(TypeError, match="`x`"):
        model(torch.ones(2, 4, 3, dtype=dtype))


@pytest.mark.parametrize("name", ["ntm", "dnc"])
def test_ntm_dnc_accept_another_float_dtype_under_autocast(name):
    model = _ntm() if name == "ntm" else _dnc()
    x = torch.ones(2, 3, 3, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = model(x)
    assert y.shape == (2, 3, 3) and torch.isfinite(y.float()).all()
    y.float().sum().backward()  # backward too: gradients reach the bf16 input and every parameter
    assert x.grad is not None and x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="`x`"):
        model(torch.ones(2, 3, 3, dtype=torch.long))
