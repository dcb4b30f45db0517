"""memnets.ops.gpu.fix_interpreter: an older Triton interpreter, whose scalar kernel arguments
fail ``range(T)`` under NumPy 2.4 and later (``int()`` of a one-element array), is given the
later interpreter's reading; a Triton that already reads them so is left alone."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.interpret,  # make test-triton, where triton is installed
              pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy")
                                 is None, reason="not installed: triton or numpy (pip install 'memnets[gpu]' numpy)")]


class _Scope:
    def __init__(self):
        self.attrs = {}

    def set_attr(self, obj, name, value):
        self.attrs[name] = value


class _Handle:
    def __init__(self, data):
        self.data = data


class _Tensor:
    def __init__(self, data):
        self.handle = _Handle(data)


def test_an_old_interpreter_is_fixed_and_a_new_one_left_alone(monkeypatch):
    import numpy as np
    from triton.runtime import interpreter

    from memnets.ops.gpu import fix_interpreter

    def old_style(tensor, scope):  # Triton <= 3.6's reading
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))
        scope.set_attr(tensor, "__repr__", lambda self: repr(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", old_style)
    assert fix_interpreter() is True
    scope = _Scope()
    interpreter._patch_lang_tensor(object, scope)
    assert scope.attrs["__index__"](_Tensor(np.array([7], dtype=np.int32))) == 7  # one-element array
    assert scope.attrs["__index__"](_Tensor(np.array(5))) == 5
    assert "__repr__" in scope.attrs  # the rest of the original kept
    assert fix_interpreter() is False  # once

    def new_style(tensor, scope):  # later Triton's reading
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", new_style)
    assert fix_interpreter() is False and interpreter._patch_lang_tensor is new_style


def test_an_interpreter_without_a_scope_argument_is_fixed_too(monkeypatch):
    """Triton <= 3.5 sets the attributes on the tensor class itself (no scope argument)."""
    import numpy as np
    from triton.runtime import interpreter

    from memnets.ops.gpu import fix_interpreter

    def older_style(tensor):
        tensor.__index__ = lambda self: int(self.handle.data)
        tensor.__repr__ = lambda self: repr(self.handle.data)

    class Tensor(_Tensor):
        pass

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", older_style)
    assert fix_interpreter() is True
    interpreter._patch_lang_tensor(Tensor)
    assert Tensor.__index__(Tensor(np.array([7], dtype=np.int32))) == 7
    assert Tensor.__repr__(Tensor(np.array(5))) == "array(5)"  # the rest of the original kept
