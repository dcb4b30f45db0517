"""TransformerEncoder, UniversalTransformer (ACT) and LSTMAttentionBaseline."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import memnets
from memnets.models.lstm_baseline import LSTMAttentionBaseline
from memnets.models.transformer import ConvTransition, TransformerEncoder, UniversalTransformer, sinusoidal_embedding

D, H = 16, 4


def _copy_into_torch_layer(ours, ref):
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
        ref.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
        ref.self_attn.out_proj.weight.copy_(ours.attn.out.weight)
        ref.self_attn.out_proj.bias.copy_(ours.attn.out.bias)
        for a, b in ((ours.ff[0], ref.linear1), (ours.ff[3], ref.linear2), (ours.norm1, ref.norm1),
                     (ours.norm2, ref.norm2)):
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_encoder_matches_torch(norm_first, causal):
    torch.manual_seed(0)
    ours = TransformerEncoder(D, 2, H, dim_feedforward=24, norm_first=norm_first, causal=causal).double()
    layer = nn.TransformerEncoderLayer(D, H, 24, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D) if norm_first else None,
                                enable_nested_tensor=False).double()
    for a, b in zip(ours.layers, ref.layers):
        _copy_into_torch_layer(a, b)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    causal_mask = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64) if causal else None
    want = ref(x, mask=causal_mask, src_key_padding_mask=~mask, is_causal=causal)
    got = ours(x, mask)
    torch.testing.assert_close(got[mask], want[mask])


@pytest.mark.parametrize("attention", ["softmax", "nam", "linear", "delta"])
def test_causal_encoder_does_not_see_future(attention):
    torch.manual_seed(1)
    enc = TransformerEncoder(D, 2, H, attention=attention, causal=True, max_len=12).double()
    x = torch.randn(2, 9, D, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] += 1.0
    y, y2 = enc(x), enc(x2)
    torch.testing.assert_close(y2[:, :5], y[:, :5], rtol=0, atol=1e-12)
    assert (y2[:, 5:] - y[:, 5:]).abs().max() > 1e-4


@pytest.mark.parametrize("attention", ["softmax", "nam", "linear"])
def test_positions(attention):
    torch.manual_seed(2)
    x = torch.randn(1, 6, D, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    plain = TransformerEncoder(D, 1, H, attention=attention).double()  # no positions: equivariant
    torch.testing.assert_close(plain(x[:, perm]), plain(x)[:, perm])
    learned = TransformerEncoder(D, 1, H, attention=attention, max_len=6).double()
    assert (learned(x[:, perm]) - learned(x)[:, perm]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="max_len"):
        learned(torch.randn(1, 7, D, dtype=torch.float64))


def test_universal_transformer_is_shared_layer_loop():
    torch.manual_seed(3)
    ut = UniversalTransformer(D, H, num_steps=3, max_len=8).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    pos = ut.positions.table.weight[:5]
    steps = sinusoidal_embedding(3, D, dtype=torch.float64)
    s = x
    for n in range(3):
        s = ut.layer(s + pos + steps[n])
    torch.testing.assert_close(ut(x), ut.norm(s))
    assert ut.ponder_cost is None
    assert sum(p.numel() for p in ut.parameters()) == memnets.count_parameters(ut)


def _conv_transition_by_hand(ct, x, mask=None):
    """Position by position: h_i = ReLU(b + Σ_j W_j x_{i+j-1}) over j = 0, 1, 2, zero outside the
    sequence and at dropped positions, twice."""
    B, S, _ = x.shape
    h = x
    for conv in (ct.conv1, ct.conv2):
        if mask is not None:
            h = h * mask.to(h.dtype).unsqueeze(-1)
        out = torch.empty(B, S, conv.out_channels, dtype=x.dtype)
        for i in range(S):
            acc = conv.bias.expand(B, -1).clone()
            for j in range(3):
                if 0 <= i + j - 1 < S:
                    acc = acc + h[:, i + j - 1] @ conv.weight[:, :, j].T
            out[:, i] = torch.relu(acc)
        h = out
    return h


def test_conv_transition_matches_a_position_by_position_reference():
    torch.manual_seed(11)
    ct = ConvTransition(D, 24).double()
    x = torch.randn(2, 6, D, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    for m in (None, mask):
        y, ref = ct(x, m), _conv_transition_by_hand(ct, x, m)
        torch.testing.assert_close(y, ref)
        g = torch.randn_like(y)
        torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(ref, x, g)[0])
    # a dropped position's input reaches no kept position
    x2 = x.detach().clone()
    x2[1, 4:] += 5.0
    torch.testing.assert_close(ct(x2, mask)[:, :4], ct(x.detach(), mask)[:, :4])
    assert (ct(x2)[1, 3] - ct(x.detach())[1, 3]).abs().max() > 1e-3  # without the mask it does
    assert torch.autograd.gradcheck(lambda t: ct(t, mask), (x.detach().clone().requires_grad_(),))
    with pytest.raises(ValueError, match="`mask` expected"):
        ct(x, mask[:, :5])


def test_authors_universal_transformer_form():
    """transition="conv", an input projection, no final LayerNorm, sinusoidal positions: the NAM
    authors' UT, a loop of the shared pre-LN layer with the convolutional transition."""
    torch.manual_seed(12)
    ut = UniversalTransformer(D, H, num_steps=3, transition="conv", dim_feedforward=D, input_projection=True,
                              final_norm=False).double()
    assert ut.norm is None and ut.positions.table is None and isinstance(ut.layer.ff, ConvTransition)
    # parameters: attention 4·D² + 4·D, two width-3 convolutions 2·(3·D² + D), projection D², two LayerNorms
    assert memnets.count_parameters(ut) == 4 * D * D + 4 * D + 2 * (3 * D * D + D) + D * D + 4 * D
    x = torch.randn(2, 5, D, dtype=torch.float64)
    pos = sinusoidal_embedding(5, D, dtype=torch.float64)
    steps = sinusoidal_embedding(3, D, dtype=torch.float64)
    s = ut.proj(x)
    for n in range(3):
        t = s + pos + steps[n]
        t = t + ut.layer.attn(ut.layer.norm1(t))
        s = t + _conv_transition_by_hand(ut.layer.ff, ut.layer.norm2(t))
    torch.testing.assert_close(ut(x), s)
    with pytest.raises(ValueError, match="`transition` expected"):
        UniversalTransformer(D, H, transition="sepconv")
    with pytest.raises(ValueError, match="cannot be causal"):
        UniversalTransformer(D, H, transition="conv", causal=True)


def test_act_hand_cases():
    torch.manual_seed(4)
    ut = UniversalTransformer(D, H, num_steps=4, act=True).double()
    plain = UniversalTransformer(D, H, num_steps=4).double()
    plain.load_state_dict({k: v for k, v in ut.state_dict().items() if not k.startswith("halting")})
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        ut.halting.weight.zero_()
        ut.halting.bias.fill_(-60.0)  # p ≈ 0: never halts early, the last step gets R ≈ 1
    torch.testing.assert_close(ut(x), plain(x))
    torch.testing.assert_close(ut.ponder_times, torch.full((2, 5), 5.0, dtype=torch.float64))
    with torch.no_grad():
        ut.halting.bias.fill_(60.0)  # p ≈ 1 > threshold: halts after one step with R = 1
    one = UniversalTransformer(D, H, num_steps=1).double()
    one.load_state_dict(plain.state_dict())
    torch.testing.assert_close(ut(x), one(x))
    torch.testing.assert_close(ut.ponder_cost, torch.tensor(2.0, dtype=torch.float64))


def test_act_weights_sum_to_one_and_ponder_is_differentiable():
    torch.manual_seed(5)
    ut = UniversalTransformer(D, H, num_steps=6, act=True, act_threshold=0.9, norm_first=False).double()
    with torch.no_grad():
        ut.halting.bias.fill_(-1.0)
    # replace the layer by a constant map: output = Σ_n w_n · c, so Σ w_n = 1 shows directly
    c = torch.randn(D, dtype=torch.float64)
    ut.layer.forward = lambda x, mask=None: c.expand_as(x)
    x = torch.randn(3, 4, D, dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2, 2:] = False
    y = ut(x, mask)
    torch.testing.assert_close(y, c.expand_as(y))
    n = ut.ponder_times.floor()
    assert ((n >= 1) & (n <= 6)).all() and (ut.ponder_times > n).all()  # N ≥ 1 and 0 < R ≤ 1
    ut.ponder_cost.backward()
    assert ut.halting.bias.grad.abs() > 0


def test_lstm_baseline_packing_and_mask():
    torch.manual_seed(6)
    m = LSTMAttentionBaseline(D, num_layers=3).double()
    assert m.encoder.num_layers == 1 and m.decoder.num_layers == 2
    x = torch.randn(2, 7, D, dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    y = m(x, mask)
    torch.testing.assert_close(y[1, :4], m(x[1:, :4])[0])  # padding changes nothing
    assert torch.equal(y[1, 4:], torch.zeros_like(y[1, 4:]))
    torch.testing.assert_close(y[0], m(x[:1])[0])
    with pytest.raises(ValueError, match="right-padding"):
        m(x, torch.tensor([[True] * 7, [False] + [True] * 6]))
    with pytest.raises(ValueError, match="even"):
        LSTMAttentionBaseline(15)


def test_attention_options_reach_the_layers():
    enc = TransformerEncoder(D, 2, H, attention="delta", causal=True, attention_options={"feature_map": "dpfp2"})
    assert all(layer.attn.feature_map == "dpfp2" for layer in enc.layers)
    assert TransformerEncoder.from_config(enc.config).config == enc.config
    ut = UniversalTransformer(D, H, attention="delta", causal=True, attention_options={"feature_map": "dpfp1"})
    assert ut.layer.attn.feature_size == 2 * (D // H)
    assert ut(torch.randn(1, 5, D)).shape == (1, 5, D)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="causal only"):
        TransformerEncoder(D, 1, H, attention="delta")
    with pytest.raises(ValueError, match="`attention` expected"):
        UniversalTransformer(D, H, attention="local")
    with pytest.raises(ValueError, match="activation"):
        TransformerEncoder(D, 1, H, activation="swish")
    enc = TransformerEncoder(D, 1, H)
    with pytest.raises(ValueError, match="`x` expected"):
        enc(torch.randn(2, 5, D + 2))
    with pytest.raises(ValueError, match="`mask` expected"):
        enc(torch.randn(2, 5, D), torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="`x` expected"):
        LSTMAttentionBaseline(D)(torch.randn(5, D))


MODELS = [
    ("transformer", dict(d_model=D, num_layers=2, num_heads=H, max_len=10)),
    ("transformer", dict(d_model=D, num_layers=2, num_heads=H, attention="nam", norm_first=True)),
    ("transformer", dict(d_model=D, num_layers=1, num_heads=H, attention="linear")),
    ("transformer", dict(d_model=D, num_layers=1, num_heads=H, attention="delta", causal=True)),
    ("universal_transformer", dict(d_model=D, num_heads=H, num_steps=3)),
    ("universal_transformer", dict(d_model=D, num_heads=H, num_steps=3, act=True, attention="nam")),
    ("lstm_attention", dict(d_model=D)),
]


@pytest.mark.parametrize("name,kw", MODELS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MODELS)])
def test_trains_on_tiny_task(name, kw):
    """Target at every position: the mean of the (visible) inputs' first 4 channels."""
    torch.manual_seed(0)
    model = memnets.build_model(name, **kw)
    head = nn.Linear(D, 4)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-2)
    causal = kw.get("causal", False)
    x = torch.randn(16, 10, D)
    if causal:
        target = x[..., :4].cumsum(1) / torch.arange(1, 11).view(1, 10, 1)
    else:
        target = x[..., :4].mean(1, keepdim=True).expand(16, 10, 4)
    losses = []
    for _ in range(60):
        loss = (head(model(x)) - 3 * target).pow(2).mean()
        if getattr(model, "ponder_cost", None) is not None:
            loss = loss + 1e-3 * model.ponder_cost
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses


def test_docstring_example_runs():
    import textwrap

    import memnets.models.transformer as mod

    block = mod.__doc__.split("Example::", 1)[1]
    ns: dict = {}
    exec(textwrap.dedent(block), {"torch": torch, "TransformerEncoder": TransformerEncoder,
                                  "UniversalTransformer": UniversalTransformer}, ns)
    assert ns["y"].shape == (8, 100, 64) and ns["aux"].dim() == 0

    import memnets.models.lstm_baseline as lstm_mod

    block = lstm_mod.__doc__.split("Example::", 1)[1]
    ns = {}
    exec(textwrap.dedent(block), {"torch": torch, "LSTMAttentionBaseline": LSTMAttentionBaseline}, ns)
    assert ns["y"].shape == (2, 20, 64) and not ns["y"][1, 12:].any()
