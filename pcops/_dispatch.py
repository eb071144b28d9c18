"""Calling an op without its Python autograd kernel when no gradient or tangent can flow.

The ops with a differentiable output (knn, group, interpolate, neighbor_dist2,
ball_query_dist2, ...) have their derivatives in Python (``pcops/_autograd.py``): every call of
such an op through the dispatcher enters that Python kernel, which checks the inputs and
redispatches below autograd -- 5-20 us of host time, a third or more of the whole call on small
clouds (inference, no_grad). The wrappers call :func:`call` instead, which redispatches below
autograd itself when nothing can flow, and goes through the autograd kernel otherwise (and
under torch.compile, which traces it).
"""
import torch
from torch import Tensor
from torch.autograd import forward_ad as _forward_ad

from ._autograd import FUNCTIONS, _below_autograd, _transforms_active
from ._checks import argument_error

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def call(op, grad_inputs, *args):
    """``op(*args)``, skipping all Python autograd code unless a gradient or a tangent can flow
    to one of ``grad_inputs`` (the tensor arguments that are differentiable): then the op's
    autograd.Function (pcops/_autograd.py) is applied. Something can flow when one of them
    requires grad under grad mode, a forward-AD level is open, or a torch.func transform is
    active (``pcops._autograd.tracked``, inlined: this is every inference call's path). The
    result is the same bits either way. Under torch.compile the op itself is traced.

    Eager calls go to ``op._op``, the callable behind ``OpOverload.__call__`` (pcops' call hook,
    pcops/_loader.py), skipping that method's Python frame (~0.4 us a call). ``__call__`` adds
    nothing else for pcops' ops: its other branch serves the ops of torch.library.custom_op (a
    Python-object dispatcher), which pcops' ops are not.

    An argument torch cannot convert (an int beyond int64) raises an error naming the op and
    the argument (:func:`pcops._checks.argument_error`; a try block costs nothing when nothing
    is raised)."""
    try:
        if _is_compiling():
            return op(*args)
        if _transforms_active() or _forward_ad._current_level >= 0:
            return FUNCTIONS[op].apply(*args)
        if _grad_enabled():
            for t in grad_inputs:
                if isinstance(t, Tensor) and t.requires_grad:
                    return FUNCTIONS[op].apply(*args)
        with _below_autograd():
            return op._op(*args)
    except RuntimeError:
        error = argument_error(op, args)
        if error is None:
            raise
        raise error from None


def call_plain(op, *args):
    """``op(*args)`` for an op without derivatives, with :func:`call`'s messages (eager calls
    go to ``op._op`` as in :func:`call`)."""
    try:
        if _is_compiling():
            return op(*args)
        return op._op(*args)
    except RuntimeError:
        error = argument_error(op, args)
        if error is None:
            raise
        raise error from None


# The Autograd kernels of the ops whose outputs are not differentiable (no_autograd).
_LIBRARY = torch.library.Library("pcops", "IMPL")


def no_autograd(*names):
    """Lets the Autograd key of the ops `names` fall through: their outputs (indices, counts,
    masks) are not differentiable, so a call goes straight to the CPU / CUDA kernel with no
    autograd kernel in between (no Python, no autograd fallback); inputs that require grad are
    accepted and the outputs do not require grad. A C++ fallthrough, registered from here
    because the stable ABI cannot register one."""
    for name in names:
        _LIBRARY.impl(name, torch.library.fallthrough_kernel, "Autograd")
