"""An independent reference for one step of :class:`memnets.NTM`, written out from the equations
of docs/maths.md §7 (Graves, Wayne & Danihelka 2014) with explicit loops over heads, slots and
shifts and elementary tensor arithmetic only: nothing here calls ``memnets.ops.addressing``,
the model's own methods or ``torch.nn.functional``. It only reads the model's parameters.

State is a plain dict with the fields of ``NTMState``: ``memory [B, N, W]``,
``read_weights [B, R, N]``, ``write_weights [B, Hw, N]``, ``reads [B, R, W]``, ``h [B, C]``,
``c [B, C]`` (``[B, 0]`` for the one-layer tanh controller).

One step, in this order (docs/maths.md §7, "Model"):

1. controller over ``[x_t ; r_{t-1}]``: an LSTM (gates i, f, g, o) whose recurrent input is
   ``[r_{t-1} ; h_{t-1}]``, or ``h_t = tanh(W_x x_t + b_x + W_r r_{t-1})``;
2. head parameters ``W_h h_t + b_h``: R read heads then Hw write heads, each
   ``(k [W], β̂, ĝ, γ̂, ŝ [2n+1])``, then per write head ``(ê [W], a [W])``; activations
   ``k = tanh``, ``β = softplus``, ``g = σ``, ``γ = 1 + softplus``, ``s = softmax``, ``e = σ``,
   ``a`` linear;
3. write heads address ``M_{t-1}`` (from their previous weightings) and write it: erase then add;
4. read heads address the new ``M_t`` (from their previous weightings) and read it;
5. ``y_t = W_o [h_t ; r_t] + b_o``.

Addressing per head: ``w_c(i) = softmax_i(β cos(k, M[i]))`` with
``cos(k, m) = k·m / (√(‖k‖² + eps) √(‖m‖² + eps))``, eps = 1e-6 (the numerics adopted in
§7); ``w_g = g w_c + (1 − g) w_{t−1}``; ``w̃(i) = Σ_j w_g(j) s(i − j)`` over the shifts
``i − j ∈ −n..n`` modulo N (index ``n + d`` of ``s`` is the shift d); ``w(i) = w̃(i)^γ / Σ_j w̃(j)^γ``,
computed with §7's eps as ``(w̃(i) + 1e-12)^γ / Σ_j (w̃(j) + 1e-12)^γ``.
"""
from __future__ import annotations

import torch

COS_EPS = 1e-6  # under the square root of each norm in the cosine
SHARPEN_EPS = 1e-12  # added to w̃ before raising it to γ


# ---------------------------------------------------------------- elementary functions
def sigmoid(z: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + torch.exp(-z))


def softplus(z: torch.Tensor) -> torch.Tensor:
    """``log(1 + e^z)`` in its overflow-free form ``max(z, 0) + log(1 + e^{−|z|})``."""
    return torch.clamp(z, min=0) + torch.log1p(torch.exp(-torch.abs(z)))


def softmax(z: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim."""
    e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``W x + b`` for a batch of row vectors ``x [B, in]``, ``weight [out, in]``."""
    y = x @ weight.T
    return y if bias is None else y + bias


# ---------------------------------------------------------------- addressing, one head at a time
def content(memory: torch.Tensor, key: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``w_c(i) = softmax_i(β cos(k, M[i]))``; memory ``[B, N, W]``, key ``[B, W]``, β ``[B]``."""
    N = memory.shape[1]
    key_norm = torch.sqrt((key * key).sum(-1) + COS_EPS)
    scores = []
    for i in range(N):
        m = memory[:, i]
        cos = (key * m).sum(-1) / (key_norm * torch.sqrt((m * m).sum(-1) + COS_EPS))
        scores.append(beta * cos)
    return softmax(torch.stack(scores, dim=-1))


def interpolation(w_c: torch.Tensor, w_prev: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``w_g = g w_c + (1 − g) w_{t−1}``; weightings ``[B, N]``, g ``[B]``."""
    return g[:, None] * w_c + (1 - g[:, None]) * w_prev


def shift(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Circular convolution ``w̃(i) = Σ_j w(j) s(i − j)``; ``w [B, N]``, ``s [B, 2n+1]``, index n + d
    of ``s`` holding the shift d ∈ −n..n (a shift d moves weight from slot j to slot j + d)."""
    N, n = w.shape[1], s.shape[1] // 2
    out = []
    for i in range(N):
        acc = torch.zeros_like(w[:, 0])
        for d in range(-n, n + 1):  # the term j = i − d (mod N) of the sum
            acc = acc + w[:, (i - d) % N] * s[:, n + d]
        out.append(acc)
    return torch.stack(out, dim=-1)


def sharpening(w: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``w(i) = w̃(i)^γ / Σ_j w̃(j)^γ``; ``w [B, N]``, γ ``[B]``. With §7's adopted numerics
    ``softmax(γ log(w̃ + eps))``, i.e. ``(w̃ + eps)^γ / Σ_j (w̃(j) + eps)^γ`` with eps = 1e-12 (the
    plain form differs by up to about 1e-10 in the gradients over a few steps)."""
    p = (w + SHARPEN_EPS) ** gamma[:, None]
    return p / p.sum(-1, keepdim=True)


def address(memory, key, beta, g, s, gamma, w_prev):
    """Content, interpolation, shift, sharpening, in the order of §7."""
    return sharpening(shift(interpolation(content(memory, key, beta), w_prev, g), s), gamma)


def write(memory: torch.Tensor, ws: list, erases: list, adds: list) -> torch.Tensor:
    """``M'[i] = M[i] ∘ Π_h (1 − w_h(i) e_h) + Σ_h w_h(i) a_h`` (erase, then add; heads' erases
    multiply and their adds sum)."""
    rows = []
    for i in range(memory.shape[1]):
        keep = torch.ones_like(memory[:, i])
        added = torch.zeros_like(memory[:, i])
        for w, e, a in zip(ws, erases, adds):
            keep = keep * (1 - w[:, i, None] * e)
            added = added + w[:, i, None] * a
        rows.append(memory[:, i] * keep + added)
    return torch.stack(rows, dim=1)


def read(memory: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``r = Σ_i w(i) M[i]``; ``memory [B, N, W]``, ``w [B, N]`` -> ``[B, W]``."""
    r = torch.zeros_like(memory[:, 0])
    for i in range(memory.shape[1]):
        r = r + w[:, i, None] * memory[:, i]
    return r


# ---------------------------------------------------------------- the model
def init_state(model, batch_size: int, dtype=torch.float64) -> dict:
    """The model's initial state: constant memory, softmax of the learned weighting logits,
    learned read vectors and controller state, repeated over the batch."""
    cfg = model.config
    B = batch_size

    def rep(p):
        return p.to(dtype).unsqueeze(0).expand(B, *p.shape)

    return {
        "memory": torch.full((B, cfg.memory_slots, cfg.word_size), cfg.memory_init, dtype=dtype),
        "read_weights": softmax(rep(model.read_w0)),
        "write_weights": softmax(rep(model.write_w0)),
        "reads": rep(model.r0),
        "h": rep(model.h0),
        "c": rep(model.c0),
    }


def step(model, x_t: torch.Tensor, state: dict):
    """One NTM step: ``x_t [B, input_size]`` -> ``(y_t [B, output_size], new state dict)``."""
    cfg = model.config
    W, R, Hw, C, n = cfg.word_size, cfg.read_heads, cfg.write_heads, cfg.controller_size, cfg.shift_range
    # 1. controller over [x_t ; r_{t-1}]
    r_prev = torch.cat([state["reads"][:, h] for h in range(R)], dim=-1)  # [B, R*W], head after head
    gx = affine(x_t, model.ctrl_x.weight, model.ctrl_x.bias)
    if cfg.controller == "lstm":
        z = gx + affine(torch.cat([r_prev, state["h"]], dim=-1), model.ctrl_rh.weight)
        i_g, f_g = sigmoid(z[:, :C]), sigmoid(z[:, C:2 * C])
        cand, o_g = torch.tanh(z[:, 2 * C:3 * C]), sigmoid(z[:, 3 * C:])
        c = f_g * state["c"] + i_g * cand
        h = o_g * torch.tanh(c)
    else:
        h = torch.tanh(gx + affine(r_prev, model.ctrl_rh.weight))
        c = state["c"]
    # 2. head parameters: R read heads, Hw write heads, then (erase, add) per write head
    p = affine(h, model.heads.weight, model.heads.bias)
    P = W + 3 + 2 * n + 1
    heads = []
    for j in range(R + Hw):
        q = p[:, j * P:(j + 1) * P]
        heads.append(dict(key=torch.tanh(q[:, :W]), beta=softplus(q[:, W]), g=sigmoid(q[:, W + 1]),
                          gamma=1 + softplus(q[:, W + 2]), s=softmax(q[:, W + 3:])))
    erases, adds = [], []
    for j in range(Hw):
        q = p[:, (R + Hw) * P + j * 2 * W:(R + Hw) * P + (j + 1) * 2 * W]
        erases.append(sigmoid(q[:, :W]))
        adds.append(q[:, W:])

    def weighting(memory, hd, w_prev):
        return address(memory, hd["key"], hd["beta"], hd["g"], hd["s"], hd["gamma"], w_prev)

    # 3. write heads address M_{t-1}, then erase and add
    w_w = [weighting(state["memory"], heads[R + j], state["write_weights"][:, j]) for j in range(Hw)]
    memory = write(state["memory"], w_w, erases, adds)
    # 4. read heads address and read M_t
    w_r = [weighting(memory, heads[j], state["read_weights"][:, j]) for j in range(R)]
    reads = [read(memory, w) for w in w_r]
    # 5. output from [h_t ; r_t]
    y = affine(torch.cat([h, *reads], dim=-1), model.out.weight, model.out.bias)
    new = {"memory": memory, "read_weights": torch.stack(w_r, 1), "write_weights": torch.stack(w_w, 1),
           "reads": torch.stack(reads, 1), "h": h, "c": c}
    return y, new


def run(model, x: torch.Tensor, state: dict | None = None):
    """The reference step applied over ``x [B, T, input_size]``: ``(y [B, T, output_size], state)``."""
    state = init_state(model, x.shape[0], x.dtype) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        y, state = step(model, x[:, t], state)
        ys.append(y)
    return torch.stack(ys, 1), state
