"""CUDA-graph replay of the recurrent loops (memnets.ops.gpu.graphs): the buffer handling, on
the CPU through the eager stand-in, which keeps a CUDA graph's contract (static inputs, outputs
rewritten in place on every replay). The capture itself runs on a GPU
(tests/test_triton_graphs.py on CUDA, ``make gpu-check``)."""
from __future__ import annotations

import pytest
import torch

from memnets.ops.gpu import graphs


@pytest.fixture(autouse=True)
def _fresh():
    graphs.clear()
    yield
    graphs.clear()


def _loop(a, b):
    """A loop on its arguments alone: out-of-place results and one buffer updated in place."""
    acc = torch.zeros_like(a)
    for _ in range(3):
        acc.add_(a * b)
    return acc, a @ b.t()


def _call(a, b, key="k"):
    return graphs.graphed(key, _loop, a, b)


def test_replay_matches_eager_and_outputs_stay_the_callers():
    xs = [(torch.randn(4, 5), torch.randn(4, 5)) for _ in range(4)]
    want = [_loop(a, b) for a, b in xs]
    before = graphs.stats()
    with graphs.stand_in():
        got = [_call(a, b) for a, b in xs]
    after = graphs.stats()
    # once eager, captured the second time, replayed from then on
    assert after.get("eager", 0) - before.get("eager", 0) == 1
    assert after.get("captures", 0) - before.get("captures", 0) == 1
    assert after.get("replays", 0) - before.get("replays", 0) == 3
    for g, w in zip(got, want):  # each call's results are still its own after later replays
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b)
    assert got[1][0].data_ptr() != got[2][0].data_ptr()


def test_inputs_are_copied_not_aliased():
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    with graphs.stand_in():
        _call(a, b)
        _call(a, b)
        a2 = a.clone()
        first = _call(a, b)[0].clone()
        a.mul_(2)  # the caller changes its tensor: the next call sees it
        second = _call(a, b)[0]
    torch.testing.assert_close(first, _loop(a2, b)[0])
    torch.testing.assert_close(second, _loop(a, b)[0])


def test_shapes_and_keys_get_their_own_graphs_and_old_ones_are_evicted(monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    with graphs.stand_in():
        for n in (2, 3, 4):
            for _ in range(2):
                a = torch.randn(n, 5)
                torch.testing.assert_close(_call(a, a)[1], a @ a.t())
        assert len(graphs._CACHE) == 2
        a = torch.randn(3, 5)
        torch.testing.assert_close(_call(a, a, key="other")[1], a @ a.t())  # another key: eager first
        assert graphs.stats().get("evictions", 0) >= 1
        captures = graphs.stats()["captures"]
        for _ in range(3):  # the evicted shape (n = 2) comes back: eager, never captured again
            a = torch.randn(2, 5)
            torch.testing.assert_close(_call(a, a)[1], a @ a.t())
        assert graphs.stats()["captures"] == captures


def test_switched_off_and_on_the_cpu_without_the_stand_in(monkeypatch):
    a = torch.randn(2, 2)
    for _ in range(3):
        _call(a, a)  # CPU tensors, no stand-in: never a graph
    assert not graphs._CACHE
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    with graphs.stand_in():
        assert not graphs.enabled(a)
        for _ in range(3):
            _call(a, a)
    assert not graphs._CACHE


def test_a_failed_capture_warns_once_and_runs_eagerly():
    calls = []

    def flaky(a):
        calls.append(1)
        if len(calls) == 2:  # the capture's run
            raise RuntimeError("no capture here")
        return (a + 1,)

    a = torch.randn(3)
    before = graphs.stats().get("failures", 0)
    with graphs.stand_in():
        graphs.graphed("flaky", flaky, a)
        with pytest.warns(RuntimeWarning, match="capture of 'flaky' failed"):
            out = graphs.graphed("flaky", flaky, a)
        torch.testing.assert_close(out[0], a + 1)
        torch.testing.assert_close(graphs.graphed("flaky", flaky, a)[0], a + 1)  # eager now, no warning
    assert graphs.stats().get("failures", 0) - before == 1


def test_autocast_state_is_part_of_the_key():
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    with graphs.stand_in():
        _call(a, b)
        _call(a, b)  # captured without autocast
        before = dict(graphs.stats())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = _call(a, b)  # another state: seen once, so eager, not the graph of the other
        after = graphs.stats()
    assert after.get("eager", 0) - before.get("eager", 0) == 1
    assert after.get("replays", 0) == before.get("replays", 0)
    torch.testing.assert_close(out[1].float(), (a @ b.t()), atol=0.1, rtol=0.05)


def test_a_graph_captured_in_inference_mode_replays_only_there():
    """Buffers made inside ``torch.inference_mode()`` are inference tensors: a call outside it
    (training after an evaluation) gets a graph of its own instead of writing into them."""
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    with graphs.stand_in():
        with torch.inference_mode():
            _call(a, b)
            _call(a, b)  # captured in inference mode
            _call(a, b)
        before = dict(graphs.stats())
        out = [_call(a, b) for _ in range(3)]  # outside: eager, captured, replayed
        after = graphs.stats()
        with torch.inference_mode():
            again = _call(a, b)
    assert after.get("eager", 0) - before.get("eager", 0) == 1
    assert after.get("captures", 0) - before.get("captures", 0) == 1
    for o in out + [again]:
        torch.testing.assert_close(o[1], a @ b.t())
    assert not out[-1][0].is_inference()


def test_listeners_go_around_every_call_eager_captured_or_replayed(monkeypatch):
    """graphs.listening: each listener gets the key, the inputs and the call, outermost first,
    whether the loop runs eagerly, is captured or replays; it is gone after its context."""
    seen = []

    def outer(key, inputs, call):
        seen.append(("outer", key, len(inputs)))
        out = call()
        seen.append(("outer done", len(out)))
        return out

    def inner(key, inputs, call):
        seen.append(("inner", key))
        return call()

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    before = graphs.stats()
    with graphs.listening(outer), graphs.listening(inner), graphs.stand_in():
        outs = [_call(a, b) for _ in range(3)]  # eager, captured, replayed
    after = graphs.stats()
    assert seen == [("outer", "k", 2), ("inner", "k"), ("outer done", 2)] * 3
    assert [after.get(k, 0) - before.get(k, 0) for k in ("eager", "captures", "replays")] == [1, 1, 2]
    for out in outs:
        torch.testing.assert_close(out[1], a @ b.t())
    _call(a, b)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    with graphs.listening(outer):
        _call(a, b)  # no graph, still heard
    assert len(seen) == 11 and not graphs._LISTENERS


def test_switched_on_follows_the_environment(monkeypatch):
    monkeypatch.delenv("MEMNETS_CUDA_GRAPHS", raising=False)
    assert graphs.switched_on()
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    assert not graphs.switched_on()
    with graphs.stand_in():
        assert not graphs.enabled(torch.zeros(1))


def test_inside_another_capture_the_loop_launches_plainly(monkeypatch):
    """Inside the capture of a whole training step the loop neither captures nor replays a graph
    of its own: its launches go into the outer graph."""
    monkeypatch.setattr(graphs, "_inside_capture", lambda x: True)
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    before = graphs.stats()
    with graphs.stand_in():
        outs = [_call(a, b) for _ in range(3)]
    after = graphs.stats()
    assert after.get("inside_capture", 0) - before.get("inside_capture", 0) == 3
    assert after.get("captures", 0) == before.get("captures", 0) and after.get("replays", 0) == before.get("replays", 0)
    for o in outs:
        torch.testing.assert_close(o[0], _loop(a, b)[0])


def test_copies_go_as_one_multi_tensor_copy_per_group_of_like_tensors(monkeypatch):
    """copy_all copies every pair; like tensors (dtype, device, contiguous, same strides) go as one
    torch._foreach_copy_, the others one by one; copy_groups counts those calls from the tensors
    alone, as a replay makes them."""
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda d, s: calls.append(len(d)) or real(d, s))
    a, b, c = torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, dtype=torch.float64)
    t = torch.randn(4, 3).t()  # not contiguous
    srcs = [a, b, c, t, torch.randn(2, dtype=torch.float64)]
    dsts = [torch.empty(x.shape, dtype=x.dtype) for x in srcs]
    graphs.copy_all(dsts, srcs)
    for d, s in zip(dsts, srcs):
        assert torch.equal(d, s)
    assert sorted(calls) == [2, 2]  # float32 {a, b}, float64 {c, last}; t copied alone
    assert graphs.copy_groups(srcs) == 3 and graphs.copy_groups([a, b]) == 1 and graphs.copy_groups([]) == 0
    w = torch.randn(3, requires_grad=True)
    buf = torch.empty(3)
    graphs.copy_all([buf, torch.empty(3)], [w, w])
    assert not buf.requires_grad  # the graph's buffers record no autograd history


def test_the_dnc_kernels_form_in_its_graph_keys_follows_the_environment(monkeypatch):
    """Whatever changes the DNC's kernels besides the shapes (its time loop's form, the warps
    ``MEMNETS_DNC_WARPS`` asks for) is in ``kernel_form``, which every DNC graph key holds: a
    graph captured under one setting is never replayed under another. Bad values are refused."""
    from memnets.ops.gpu import dnc, warps_from_env

    monkeypatch.delenv(dnc.WARPS_ENV, raising=False)
    monkeypatch.delenv("MEMNETS_TIME_LOOP", raising=False)
    assert warps_from_env(dnc.WARPS_ENV) is None
    assert dnc.kernel_form(64, 4, 20) == (True, None) and dnc.kernel_form(256, 4, 64) == (False, None)
    monkeypatch.setenv(dnc.WARPS_ENV, " 16 ")
    assert dnc.kernel_form(64, 4, 20) == (True, 16)
    monkeypatch.setenv("MEMNETS_TIME_LOOP", "steps")
    assert dnc.kernel_form(64, 4, 20) == (False, 16)
    for bad in ("3", "sixteen", "64"):
        monkeypatch.setenv(dnc.WARPS_ENV, bad)
        with pytest.raises(ValueError, match="MEMNETS_DNC_WARPS expected one of 1, 2, 4, 8, 16, 32"):
            dnc.kernel_form(64, 4, 20)
