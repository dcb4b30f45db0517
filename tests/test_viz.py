"""memnets.viz and `memnets viz`: traces equal the models' own computation, figures have the
expected panels (title, labelled axes, a colour bar per heatmap), PNGs are valid, bad input
and bad run directories are rejected."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import matplotlib.image
import pytest
import torch

from memnets.cli.main import main
from memnets.viz import (attention_map, collect_attention_maps, collect_lsam_gates, lsam_gates, memory_trace, model_figures,
                         plot_attention_maps, plot_dnc_memory, plot_gates, plot_learning_curves, plot_read_write,
                         plot_tape_heads, quick_figures, run_figures)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAS_NAM_TM = importlib.util.find_spec("memnets.memories.nam_tm") is not None
NAM_TM_REASON = "memnets.memories.nam_tm (NAMTuringMachine) is not available in this checkout"

TINY_OPTIONS = {
    "ntm": {"memory_slots": 8, "word_size": 8, "controller_size": 16},
    "dnc": {"memory_slots": 8, "word_size": 8, "read_heads": 2, "controller_size": 16},
    "nam_tm": {"num_tapes": 2, "tape_length": 8},
    "lsam": {"num_heads": 2},
    "transformer": {"num_layers": 1, "num_heads": 2, "max_len": 64},
}


def make_engine_run(root: Path, backbone: str) -> Path:
    """A real run directory written by the training engine: 1 epoch of 2 steps, seconds."""
    from memnets.train import config_from_dict
    from memnets.train.loop import train

    cfg = config_from_dict({
        "name": f"tiny-{backbone}", "epochs": 1, "batch_size": 2, "log_every": 1, "threads": 1, "seed": 0,
        "model": {"backbone": backbone, "d_model": 16, "options": TINY_OPTIONS[backbone]},
        "task": {"name": "reduce", "train_digits": [1, 3], "train_size": 4, "eval_size": 2,
                 "splits": {"id": [2, 3]}},
        "select_split": "id", "optim": {"lr": 1e-3}})
    run_dir = root / f"tiny-{backbone}"
    train(cfg, run_dir, quiet=True)
    return run_dir


def make_copy_run(root: Path) -> Path:
    """A run of the NTM copy task (``ntm/copy-cpu``, tiny): 1 epoch of 2 steps, sequences of length 4."""
    from memnets.train import load_config
    from memnets.train.loop import train

    cfg = load_config("ntm/copy-cpu", ["epochs=1", "task.train_size=4", "batch_size=2", "task.eval_size=2",
                                       "log_every=1", "threads=1", "model.options.memory_slots=12",
                                       "model.options.controller_size=16", "model.options.word_size=8",
                                       "task.options.max_len=4", "task.splits={len4 = [4, 4]}", "select_split=len4"])
    train(cfg, root / "copy", quiet=True)
    return root / "copy"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("runs")
    out = {bb: make_engine_run(root, bb) for bb in ("ntm", "dnc")}
    out["copy"] = make_copy_run(root)
    return out


# ----------------------------------------------------------------------------- helpers

def panels(fig):
    """The heatmap axes of a figure (those holding an image), in order."""
    return [ax for ax in fig.axes if ax.images]


def assert_well_formed(fig, n_heatmaps: int | None = None):
    """Every visible plot axis has a title and labelled axes; every heatmap has a colour bar."""
    heat = panels(fig)
    plots = [ax for ax in fig.axes if ax.get_visible() and (ax.images or ax.lines)]
    assert plots, "figure has no plots"
    for ax in plots:
        assert ax.get_title(), "an axis has no title"
        assert ax.get_xlabel() and ax.get_ylabel(), f"axis {ax.get_title()!r} has unlabelled axes"
    colorbars = [ax for ax in fig.axes if not ax.images and not ax.lines and ax.get_visible()]
    assert len(colorbars) >= len(heat), "a heatmap has no colour bar"
    if n_heatmaps is not None:
        assert len(heat) == n_heatmaps, [ax.get_title() for ax in heat]


def assert_png(path: Path):
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert img[..., :3].std() > 0.01, f"{path} is blank"


# ----------------------------------------------------------------------------- `memnets viz` on runs

def test_viz_cli_ntm_run(runs, tmp_path, capsys):
    out = tmp_path / "fig"
    assert main(["viz", str(runs["ntm"]), "--task-sample", "3", "--out", str(out), "--dpi", "40"]) == 0
    for name in ("weightings", "learning_curve"):
        assert_png(out / f"{name}.png")
    assert "weightings" in capsys.readouterr().out


def test_viz_cli_dnc_run(runs, tmp_path):
    out = tmp_path / "fig"
    assert main(["viz", str(runs["dnc"]), "--out", str(out), "--dpi", "40"]) == 0
    for name in ("weightings", "dnc_memory", "learning_curve"):
        assert_png(out / f"{name}.png")


def test_viz_cli_default_out_is_inside_run(runs):
    assert main(["viz", str(runs["copy"]), "--dpi", "40"]) == 0
    assert_png(runs["copy"] / "figures" / "weightings.png")


def test_run_figures_ntm_panels(runs):
    figs = run_figures(runs["ntm"], seed=1)
    assert set(figs) == {"weightings", "learning_curve"}
    assert_well_formed(figs["weightings"], n_heatmaps=4)
    titles = [ax.get_title() for ax in panels(figs["weightings"])]
    assert titles == ["NTM: inputs", "NTM: outputs", "NTM: write weighting", "NTM: read weighting"]
    assert_well_formed(figs["learning_curve"], n_heatmaps=0)
    assert [ax.get_title() for ax in figs["learning_curve"].axes] == ["training loss", "evaluation sequence accuracy"]


def test_run_figures_dnc_panels(runs):
    figs = run_figures(runs["dnc"])
    assert_well_formed(figs["weightings"], n_heatmaps=2 + 1 + 2)  # in, out, write, 2 read heads
    assert_well_formed(figs["dnc_memory"], n_heatmaps=3)
    titles = [ax.get_title() for ax in panels(figs["dnc_memory"])]
    assert titles[0] == "DNC: usage over time" and titles[1].startswith("DNC: temporal link matrix")


def test_copy_run_figures(runs):
    figs = run_figures(runs["copy"], seed=0)
    heat = panels(figs["weightings"])
    assert len(heat) == 4
    T = 2 * 4 + 1  # copy of length 4 (the run's split len4)
    assert heat[0].images[0].get_array().shape == (9, T)  # input bits + delimiter over time
    rows, cols = heat[2].images[0].get_array().shape  # memory slots (the visited window) over time
    assert cols == T and 1 <= rows <= 12
    curve = figs["learning_curve"]
    assert [ax.get_title() for ax in curve.axes] == ["training loss", "evaluation bit errors per sequence"]


def test_copy_run_table_row(runs):
    from memnets.viz import results_row

    res = json.loads((runs["copy"] / "results.json").read_text())
    row = results_row(runs["copy"])
    assert row["task"] == "copy" and row["model"] == "ntm" and row["steps"] == "2"
    assert row["params"] == str(res["params"]) and float(row["final cost (bits)"]) > 0
    assert "len4 bit_errors" in row


def test_viz_bad_run_dir_exits_2(tmp_path, capsys):
    assert main(["viz", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["viz", str(tmp_path / "empty")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    bad = tmp_path / "nockpt"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"name": "x"}))
    assert main(["viz", str(bad)]) == 2
    assert "no saved weights" in capsys.readouterr().err


def test_viz_mismatched_weights_exit_2(runs, tmp_path, capsys):
    import shutil

    bad = tmp_path / "mismatch"
    shutil.copytree(runs["ntm"], bad, ignore=shutil.ignore_patterns("figures"))
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model"]["options"]["memory_slots"] = 5  # the saved weights have 8 slots
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["viz", str(bad)]) == 2
    assert "cannot rebuild the model" in capsys.readouterr().err


def test_viz_corrupt_weights_exit_2(runs, tmp_path, capsys):
    import shutil

    bad = tmp_path / "corrupt"
    shutil.copytree(runs["ntm"], bad, ignore=shutil.ignore_patterns("figures"))
    best = bad / "checkpoints" / "best.safetensors"
    best.write_bytes(best.read_bytes()[:40])
    assert main(["viz", str(bad)]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_viz_bad_split_exits_2(runs, capsys):
    assert main(["viz", str(runs["ntm"]), "--split", "od_hard"]) == 2
    assert "`split` expected one of ['id']" in capsys.readouterr().err


def test_transformer_run_attention_figure(tmp_path):
    run = make_engine_run(tmp_path, "transformer")
    figs = run_figures(run, seed=2)
    assert set(figs) == {"attention", "learning_curve"}
    heat = panels(figs["attention"])
    assert [ax.get_title() for ax in heat] == ["backbone.layers.0.attn head 0", "backbone.layers.0.attn head 1"]
    assert_well_formed(figs["attention"], n_heatmaps=2)
    W = heat[0].images[0].get_array().shape[0]
    assert heat[0].images[0].get_array().shape == (W, W) and len(heat[0].get_xticklabels()) == W  # token labels


def test_viz_needs_run_or_model(capsys):
    assert main(["viz"]) == 2
    assert "either a run directory or --model" in capsys.readouterr().err


# ----------------------------------------------------------------------------- quick models

@pytest.mark.parametrize("name, expected", [("ntm", {"weightings": 4}), ("dnc", {"weightings": 5, "dnc_memory": 3}),
                                            ("lsam", {"gates": 2}), ("softmax", {"attention": 2}),
                                            ("delta", {"attention": 2, "gates": 1})])
def test_quick_figures(name, expected):
    figs = quick_figures(name, seed=0)
    assert set(figs) == set(expected)
    for key, n in expected.items():
        assert_well_formed(figs[key], n_heatmaps=n)


def test_viz_cli_quick_model(tmp_path):
    assert main(["viz", "--model", "ntm", "--out", str(tmp_path), "--dpi", "40"]) == 0
    assert_png(tmp_path / "weightings.png")


def test_nam_tm_figures(tmp_path):
    if not HAS_NAM_TM:
        print(NAM_TM_REASON)
        pytest.skip(NAM_TM_REASON)
    figs = quick_figures("nam_tm", seed=0)  # 2 tapes
    assert "tape_heads" in figs
    titles = [ax.get_title() for ax in panels(figs["tape_heads"])]
    assert "NAM-TM: read head position, tape 0" in titles and "NAM-TM: write head position, tape 1" in titles
    assert "NAM-TM: read action probabilities, tape 1" in titles, titles
    assert_well_formed(figs["tape_heads"], n_heatmaps=2 * 4)  # (read, write) x (position, action) per tape
    run = make_engine_run(tmp_path, "nam_tm")
    assert main(["viz", str(run), "--out", str(tmp_path / "fig")]) == 0
    assert_png(tmp_path / "fig" / "tape_heads.png")


# ----------------------------------------------------------------------------- traces == the models

def test_lsam_gates_replay_matches_forward():
    from memnets.memories.lsam import LSAM

    torch.manual_seed(0)
    m = LSAM(5, 8, num_heads=4, num_layers=2, bidirectional=True).double()
    x = torch.randn(2, 6, 5, dtype=torch.float64)
    y, gates = lsam_gates(m, x)
    torch.testing.assert_close(y, m(x)[0], rtol=1e-10, atol=1e-12)
    assert set(gates) == {f"layer {l} {d} {g}" for l in (0, 1) for d in ("fwd", "bwd") for g in ("p_r", "p_w")}
    for g in gates.values():
        assert g.shape == (2, 6, 2) and bool(((g >= 0) & (g <= 1)).all())


def test_lsam_gates_replay_from_a_given_state():
    from memnets.memories.lsam import LSAM, LSAMState

    torch.manual_seed(1)
    m = LSAM(4, 8, num_heads=2, bidirectional=True).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    st = LSAMState(torch.randn(2, 2, 1, 4, 4, dtype=torch.float64), torch.randn(2, 2, 4, dtype=torch.float64))
    torch.testing.assert_close(lsam_gates(m, x, st)[0], m(x, st)[0], rtol=1e-10, atol=1e-12)


def test_lsam_encdec_gates_figure():
    from memnets.models.seq import SequenceTaskModel

    torch.manual_seed(0)
    model = SequenceTaskModel("lsam_encdec", d_model=16, num_heads=2, dim_feedforward=32)
    gates = collect_lsam_gates(model, torch.randint(0, 16, (1, 9)))
    assert len(gates) == 6 and gates["backbone.decoder layer 0 fwd p_w"].shape == (1, 9, 2)
    figs = model_figures(model, torch.randint(0, 16, (1, 9)))
    titles = [ax.get_title() for ax in panels(figs["gates"])]
    assert "LSAM: encoder layer 0 bwd p_r" in titles and "LSAM: decoder layer 0 fwd p_w" in titles
    assert_well_formed(figs["gates"], n_heatmaps=6)


def test_ntm_trace_is_the_models_aux():
    from memnets.memories.ntm import NTM

    torch.manual_seed(0)
    m = NTM(3, 2, memory_slots=6, word_size=4, controller_size=8)
    x = torch.randn(1, 5, 3)
    tr = memory_trace(m, x)
    y, _, aux = m(x, return_aux=True)
    torch.testing.assert_close(tr["output"], y)
    torch.testing.assert_close(tr["write_weights"], aux.write_weights)
    torch.testing.assert_close(tr["read_weights"].sum(-1), torch.ones(1, 5, 1))
    with pytest.raises(ValueError, match="`memory` expected"):
        memory_trace(torch.nn.Linear(2, 2), x)


@pytest.mark.parametrize("kind, causal", [("softmax", False), ("softmax", True), ("nam", False), ("nam", True),
                                          ("linear", False), ("linear", True), ("delta", True)])
def test_attention_map_reproduces_layer(kind, causal):
    from memnets.attention import build_attention

    torch.manual_seed(0)
    layer = build_attention(kind, 8, 2, causal=causal).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    A = attention_map(layer, x)
    assert A.shape == (2, 2, 7, 7)
    _, _, v = layer._project(x)  # [B, S, H, dh]
    y = layer._merge(torch.einsum("bhts,bshd->bthd", A, v))
    torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-6)
    if causal:
        assert float(A.triu(1).abs().max()) == 0.0
    if kind in ("softmax", "linear"):
        torch.testing.assert_close(A.sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))


def test_attention_map_mask_and_zero_input():
    from memnets.attention import build_attention

    layer = build_attention("softmax", 8, 2).eval()
    mask = torch.tensor([[True] * 5 + [False] * 2])
    A = attention_map(layer, torch.randn(1, 7, 8), mask)
    assert float(A[..., 5:].abs().max()) == 0.0
    nam = build_attention("nam", 8, 2).eval()
    torch.nn.init.zeros_(nam.qkv.bias)
    A0 = attention_map(nam, torch.zeros(1, 4, 8))  # zero queries and keys
    assert torch.isfinite(A0).all() and float(A0.abs().max()) == 0.0
    fig = plot_attention_maps({"zero": A0[0, 0]})
    assert_well_formed(fig, n_heatmaps=1)


def test_collect_attention_maps_of_a_transformer():
    from memnets.models.transformer import TransformerEncoder

    torch.manual_seed(0)
    enc = TransformerEncoder(d_model=8, num_layers=2, num_heads=2, attention="nam")
    maps = collect_attention_maps(enc, torch.randn(1, 5, 8))
    assert len(maps) == 2 and all(A.shape == (1, 2, 5, 5) for A in maps.values())
    assert enc.training  # mode restored


# ----------------------------------------------------------------------------- plots: shapes, errors

def test_plot_functions_reject_bad_shapes():
    with pytest.raises(ValueError, match="`inputs` expected"):
        plot_read_write(torch.zeros(5), torch.zeros(5, 2), torch.zeros(5, 4), torch.zeros(5, 4))
    with pytest.raises(ValueError, match="`outputs` expected T = 5"):
        plot_read_write(torch.zeros(5, 3), torch.zeros(4, 2), torch.zeros(5, 4), torch.zeros(5, 4))
    with pytest.raises(ValueError, match="`link` expected"):
        plot_dnc_memory(torch.zeros(5, 4), torch.zeros(4))
    with pytest.raises(ValueError, match="at least one"):
        plot_gates({})
    with pytest.raises(ValueError, match="at least one"):
        plot_tape_heads({})


def test_used_slots_window_is_circular():
    from memnets.viz.plotting import used_slots

    w = torch.zeros(3, 10).numpy()
    w[0, [8, 9, 0, 1]] = 1.0
    assert used_slots([w], margin=0).tolist() == [8, 9, 0, 1]
    assert used_slots([w], margin=1).tolist() == [7, 8, 9, 0, 1, 2]
    w2 = torch.zeros(2, 3, 10).numpy()
    w2[1, 0, [3, 5]] = 0.5
    assert used_slots([w2, torch.zeros(3, 10).numpy()], margin=0).tolist() == [3, 4, 5]
    assert used_slots([torch.zeros(3, 10).numpy()]).tolist() == list(range(10))  # nothing used: all
    # the cropped panel keeps the true slot numbers on its ticks
    ww = torch.zeros(5, 40)
    ww[torch.arange(5), torch.arange(20, 25)] = 1.0
    fig = plot_read_write(torch.zeros(5, 2), torch.zeros(5, 2), ww, ww)
    ax = panels(fig)[2]
    assert ax.images[0].get_array().shape == (5 + 4, 5)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(18 <= int(t) <= 26 for t in labels), labels


def test_plots_on_degenerate_inputs():
    """All-zero weightings (an untouched memory) still draw, with no NaN in the images."""
    fig = plot_read_write(torch.zeros(4, 3), torch.zeros(4, 2), torch.zeros(4, 2, 6), torch.zeros(4, 6))
    assert_well_formed(fig, n_heatmaps=2 + 2 + 1)
    fig = plot_dnc_memory(torch.zeros(4, 6), torch.zeros(4, 6, 6), read_modes=torch.full((4, 1, 3), 1 / 3))
    assert_well_formed(fig, n_heatmaps=3)
    fig = plot_tape_heads({"read head": torch.zeros(4, 2, 8)}, {"read action": torch.full((4, 2, 4), 0.25)},
                          action_names=["LEFT", "NOOP", "RIGHT", "JUMP"])
    assert_well_formed(fig, n_heatmaps=4)
    assert [t.get_text() for t in panels(fig)[2].get_yticklabels()] == ["LEFT", "NOOP", "RIGHT", "JUMP"]


def test_learning_curves_from_records():
    recs = [{"kind": "train", "step": s, "loss": 3.0 / s} for s in range(1, 5)]
    fig = plot_learning_curves({"a": recs})
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 1
    recs += [{"kind": "eval", "step": 4, "epoch": 1, "splits": {"id": {"seq_acc": 0.5}, "od": {"seq_acc": 0.1}}}]
    fig = plot_learning_curves({"a": recs, "b": recs[:2]})
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2 and len(fig.axes[1].lines) == 2
    assert_well_formed(fig)
    with pytest.raises(ValueError, match="no training records"):
        plot_learning_curves({"a": [{"kind": "eval", "step": 1, "splits": {}}]})


def test_model_figures_of_an_unsupported_model_is_empty():
    assert model_figures(torch.nn.Linear(3, 3), torch.zeros(1, 2, 3)) == {}


# ----------------------------------------------------------------------------- readable pictures

def test_one_point_learning_curve_is_a_marker_and_shows_beside_others():
    one = [{"kind": "train", "step": 1, "loss": 2.0},
           {"kind": "eval", "step": 1, "epoch": 0.5, "splits": {"id": {"seq_acc": 0.25}}}]
    many = [{"kind": "train", "step": s, "loss": 3.0 / s} for s in range(1, 5)]
    for runs in ({"short": one}, {"short": one, "long": many}):
        fig = plot_learning_curves(runs)
        line = next(ln for ln in fig.axes[0].lines if ln.get_label() == "short")
        assert line.get_marker() not in (None, "None", "") and len(line.get_xdata()) == 1
    long = next(ln for ln in fig.axes[0].lines if ln.get_label() == "long")
    assert long.get_marker() in (None, "None", "")


@pytest.mark.parametrize("steps", [[2], [20, 30], range(1, 400, 37)])
def test_learning_curve_step_axes_tick_whole_steps(steps):
    recs = [{"kind": "train", "step": s, "loss": 1.0 + 1 / s} for s in steps]
    recs.append({"kind": "eval", "step": steps[-1], "epoch": 1, "splits": {"id": {"seq_acc": 0.5}}})
    fig = plot_learning_curves({"a": recs})
    fig.canvas.draw()
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert shown and all(float(t).is_integer() for t in shown), (ax.get_title(), shown)


def test_tape_heads_lay_tapes_side_by_side_with_tokens_and_a_note_on_signed_weights():
    T, tapes, L = 6, 4, 8
    pos = torch.linspace(-1.0, 1.25, T * tapes * L).reshape(T, tapes, L)
    act = torch.full((T, tapes, 4), 0.25)
    tokens = list("12+34=")
    fig = plot_tape_heads({"read head": pos, "write head": pos}, {"read action": act, "write action": act},
                          action_names=["LEFT", "NOOP", "RIGHT", "JUMP"], time_labels=tokens)
    w, h = fig.get_size_inches()
    assert w > h  # 4 rows of 4 tapes, not 16 panels stacked
    heat = panels(fig)
    assert len(heat) == 16
    assert [t.get_text() for t in heat[0].get_xticklabels()] == tokens
    lo, hi = heat[0].images[0].get_clim()
    assert lo == -hi and hi >= 1.25  # a scale centred at 0 that holds the signed weights
    note = " ".join(t.get_text() for t in fig.texts)
    assert "JUMP" in note and "negative" in note


def test_report_has_a_table_of_contents(tmp_path):
    from memnets.viz.report import build_report

    root = tmp_path / "runs"
    for name in ("a", "b"):
        d = root / name
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"name": name, "task": "reduce", "backbone": "bilstm",
                                                    "params": 10, "splits": {}}))
    page = build_report([root / "a", root / "b"], tmp_path / "r.html").read_text()
    nav = page[page.index('<nav class="toc">'):page.index("</nav>")]
    assert '<a href="#results">' in nav and '<a href="#a">' in nav and '<a href="#b">' in nav
    assert 'id="results"' in page and 'id="a"' in page and 'id="b"' in page


# ----------------------------------------------------------------------------- capacity runs: the recall map

def test_mqar_layout_finds_each_query_and_its_value():
    from memnets.tasks.retrieval import mqar_batch
    from memnets.viz.runs import mqar_layout

    b = mqar_batch(6, seq_len=40, num_pairs=5, vocab_size=32, generator=torch.Generator().manual_seed(3))
    for tokens, labels in zip(b.inputs, b.labels):
        q_pos, vals, targets = mqar_layout(tokens, 32)
        assert q_pos == (labels != -100).nonzero().flatten().tolist()
        assert torch.equal(vals[targets], labels[q_pos])
        assert len(vals) == 5


def test_recall_map_of_a_retrieval_model_rings_the_last_pair_of_each_key():
    from memnets.capacity.harness import RetrievalModel

    torch.manual_seed(0)
    model = RetrievalModel("delta", num_keys=10, d_key=16, value_dim=8)
    keys = torch.tensor([[3, 5, 7, 5, 1]])  # key 5 written twice: its pair is the later one
    values, queries = torch.randn(1, 5, 8), torch.tensor([[5, 1, 3]])
    figs = model_figures(model, (keys, values, queries))
    assert set(figs) == {"recall", "attention", "gates"}  # the delta rule's reads and its β
    fig = figs["recall"]
    assert_well_formed(fig, 1)
    (ax,) = panels(fig)
    pred = model(keys, values, queries)[0]
    want = torch.nn.functional.cosine_similarity(pred[:, None], values[0][None], dim=-1)
    assert torch.allclose(torch.as_tensor(ax.images[0].get_array().data, dtype=torch.float32), want, atol=1e-6)
    rings = ax.collections[0].get_offsets()
    assert rings.tolist() == [[3, 0], [4, 1], [0, 2]]  # (column, row) of each query's pair
    hits = int((want.argmax(1) == torch.tensor([3, 4, 0])).sum())
    assert f": {hits} of 3 recalled" in ax.get_title()
    assert "delta-rule" in fig._suptitle.get_text()
    # where each query reads: its read weight on each written pair, the same rings
    (ax,) = panels(figs["attention"])
    x, xq = model.memory_inputs(keys, values, queries)
    A = model.mem.implied_read(x, xq)[0, 0]  # [Q, T]
    assert torch.allclose(torch.as_tensor(ax.images[0].get_array().data, dtype=A.dtype), A, atol=1e-6)
    assert ax.collections[0].get_offsets().tolist() == [[3, 0], [4, 1], [0, 2]]
    reads_own = int((A.argmax(1) == torch.tensor([3, 4, 0])).sum())
    assert f": {reads_own} of 3 weigh their own pair most" in ax.get_title()


def test_recall_map_of_an_mqar_model_is_its_probability_of_each_stored_value():
    from memnets.capacity.harness import TokenModel
    from memnets.tasks.retrieval import mqar_batch
    from memnets.viz.runs import mqar_layout

    torch.manual_seed(0)
    model = TokenModel("linear", vocab_size=32, d_model=16)
    tokens = mqar_batch(1, seq_len=32, num_pairs=4, vocab_size=32, generator=torch.Generator().manual_seed(1)).inputs
    fig = model_figures(model, tokens)["recall"]
    (ax,) = panels(fig)
    q_pos, vals, targets = mqar_layout(tokens[0], 32)
    probs = torch.softmax(model(tokens)[0], -1)
    assert ax.images[0].get_array().shape == (len(q_pos), 4)
    assert torch.allclose(torch.as_tensor(ax.images[0].get_array().data, dtype=torch.float32),
                          probs[q_pos][:, vals], atol=1e-6)
    right = int((probs[q_pos].argmax(-1) == vals[targets]).sum())
    assert f": {right} of {len(q_pos)} recalled" in ax.get_title()


@pytest.mark.parametrize("name", ["softmax", "linear", "dpfp2", "delta", "nam", "nam_erase"])
def test_capacity_adapters_implied_attention_is_their_causal_read(name):
    """``causal(x) == o(Σ_s A[t, s] v_s)`` with ``A = implied_attention(x)``, causal (zero above
    the diagonal), and ``write_read(x, xq) == o(Σ_s R[q, s] v_s)`` with ``R = implied_read(x, xq)``,
    for every attention and fast-weight memory of the capacity lab."""
    from memnets.capacity.adapters import build_adapter

    torch.manual_seed(0)
    adapter = build_adapter(name, 12, 8, 6).double()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    A = adapter.implied_attention(x)  # [B, H, T, T]
    assert A.shape[0] == 2 and A.shape[2:] == (9, 9)
    assert not A.triu(1).any()
    mixed = torch.einsum("bhts,bshv->bthv", A, adapter.values(x))
    y = adapter.mem._readout(mixed) if hasattr(adapter, "mem") else adapter.o(mixed.flatten(-2))
    torch.testing.assert_close(y, adapter.causal(x), rtol=1e-10, atol=1e-12)
    xq = torch.randn(2, 4, 12, dtype=torch.float64)
    R = adapter.implied_read(x, xq)  # [B, H, Q, T]
    assert R.shape[0] == 2 and R.shape[2:] == (4, 9)
    mixed = torch.einsum("bhqs,bshv->bqhv", R, adapter.values(x))
    y = adapter.mem._readout(mixed) if hasattr(adapter, "mem") else adapter.o(mixed.flatten(-2))
    torch.testing.assert_close(y, adapter.write_read(x, xq), rtol=1e-10, atol=1e-12)
    gates = adapter.write_gates(x)
    want = {"delta": {"write strength β"}, "nam": {"write p_w"}, "nam_erase": {"write p_w", "erase p_e"}}
    assert set(gates) == want.get(name, set())
    assert all(g.shape == (2, 9, 1) and ((g >= 0) & (g <= 1)).all() for g in gates.values())


def test_mqar_model_figures_show_what_its_memory_reads_and_writes():
    from memnets.capacity.harness import TokenModel
    from memnets.tasks.retrieval import mqar_batch

    torch.manual_seed(0)
    model = TokenModel("nam_erase", vocab_size=32, d_model=16)
    tokens = mqar_batch(1, seq_len=24, num_pairs=4, vocab_size=32, generator=torch.Generator().manual_seed(1)).inputs
    figs = model_figures(model, tokens)
    assert set(figs) == {"recall", "attention", "gates"}
    (ax,) = panels(figs["attention"])
    A = model.mem.implied_attention(model.memory_input(tokens))[0, 0]
    assert torch.allclose(torch.as_tensor(ax.images[0].get_array().data, dtype=A.dtype), A, atol=1e-6)
    assert len(panels(figs["gates"])) == 2  # p_w and p_e
    softmax = TokenModel("softmax", vocab_size=32, d_model=16)
    assert set(model_figures(softmax, tokens)) == {"recall", "attention"}  # no gates to show


def test_plot_recall_rejects_targets_that_do_not_fit():
    from memnets.viz import plot_recall

    with pytest.raises(ValueError, match="one column per query"):
        plot_recall(torch.rand(3, 4), [0, 1], value_label="x")
    with pytest.raises(ValueError, match=r"columns in \[0, 4\) or -1"):
        plot_recall(torch.rand(2, 4), [0, 4], value_label="x")


def test_viz_cli_of_capacity_runs_draws_their_recall_maps_and_memories(tmp_path, capsys):
    run = tmp_path / "cap"
    assert main(["train", "capacity/retrieval-delta", "max_steps=2", "batch_size=2", "task.train_size=8",
                 "task.eval_size=4", "--run-dir", str(run)]) == 0
    assert main(["viz", str(run)]) == 0
    for name in ("recall", "attention", "gates", "learning_curve"):
        assert_png(run / "figures" / f"{name}.png")
    mqar = tmp_path / "mqar"
    assert main(["train", "capacity/mqar-delta", "max_steps=2", "batch_size=2", "task.train_size=8",
                 "task.eval_size=4", "task.options.seq_len=32", "task.options.num_pairs=4", "--run-dir", str(mqar)]) == 0
    assert main(["viz", str(mqar)]) == 0
    for name in ("recall", "attention", "gates", "learning_curve"):
        assert_png(mqar / "figures" / f"{name}.png")
