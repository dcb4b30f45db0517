"""SequenceTaskModel's output head option (``head="linear"`` default, ``head="mlp"`` for Fib)."""
import pytest
import torch

from memnets.models.seq import SequenceTaskModel


def test_default_head_is_one_linear():
    m = SequenceTaskModel("bilstm", d_model=16, num_layers=1)
    assert isinstance(m.head, torch.nn.Linear)
    assert {k for k in m.state_dict() if k.startswith("head.")} == {"head.weight", "head.bias"}


def test_mlp_head_shapes_and_nonlinearity():
    torch.manual_seed(0)
    m = SequenceTaskModel("nam_tm", d_model=16, head="mlp", head_dropout=0.1, num_tapes=2, tape_length=8)
    layers = [type(x).__name__ for x in m.head]
    assert layers == ["LayerNorm", "Dropout", "ReLU", "Linear"]
    m.eval()
    tokens = torch.randint(0, 16, (3, 11))
    assert m(tokens).shape == (3, 11, 16)
    # the head is not additive: h(x + y) != h(x) + h(y) - h(0) in general
    x, y, z = torch.randn(3, 16)
    assert not torch.allclose(m.head(x + y), m.head(x) + m.head(y) - m.head(z * 0), atol=1e-3)


@pytest.mark.parametrize("kw", [{"head": "conv"}, {"head": "mlp", "head_dropout": 1.0}])
def test_bad_head_options(kw):
    with pytest.raises(ValueError):
        SequenceTaskModel("bilstm", d_model=16, num_layers=1, **kw)


def test_head_option_through_run_config():
    from memnets.train.config import load_config
    from memnets.train.loop import build_model

    cfg = load_config("cpu/fib-nam_tm", ["threads=1"])
    m = build_model(cfg)
    assert isinstance(m.head, torch.nn.Sequential)
