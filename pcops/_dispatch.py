"""Calling an op without its Python autograd kernel when no gradient can flow.

The ops with a differentiable output (knn, group, interpolate, neighbor_dist2,
ball_query_dist2, ...) have their backward formulas registered in Python
(``torch.library.register_autograd``): every call of such an op, with or without grad, enters
that Python kernel, which checks the inputs and redispatches below autograd -- 5-20 us of
host time, a third or more of the whole call on small clouds (inference, no_grad). The wrappers
call :func:`call` instead, which redispatches below autograd itself when no gradient can flow,
and goes through the registered formula otherwise (and under torch.compile, which traces it).
"""
import torch
from torch import Tensor

_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling


def call(op, grad_inputs, *args):
    """``op(*args)``, skipping the autograd kernel when none of ``grad_inputs`` (the tensor
    arguments a gradient can flow to) requires grad or grad mode is off. The result is the same
    either way: outputs that do not require grad."""
    if _is_compiling() or (torch.is_grad_enabled() and any(
            isinstance(t, Tensor) and t.requires_grad for t in grad_inputs)):
        return op(*args)
    with _below_autograd():
        return op(*args)
