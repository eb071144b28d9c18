"""Derivatives of the ops in every mode: reverse, forward, and under torch.func transforms.

Each differentiable op (knn, group, group_backward, interpolate, neighbor_dist2,
ball_query_dist2) has an ``autograd.Function`` beside its wrapper in ``pcops/<op>.py``, with

* ``forward``: the op itself below autograd (the kernels' bits),
* ``setup_context`` / ``backward``: the reverse-mode formula,
* ``jvp``: the forward-mode formula, with the backward's arithmetic (differences to neighbours
  gathered by ``pcops.group``),
* ``generate_vmap_rule = True``: under ``torch.vmap`` the forward, backward and jvp run on
  batched tensors, which reach the ops' own vmap rules (:func:`fold_batch`: the vmapped
  dimension folded into B).

The wrappers apply the Function before the dispatcher (``pcops/_dispatch.py``), and only when a
gradient or a tangent can flow (:func:`tracked`): inference calls never enter Python autograd
code. :func:`register` also installs it as the op's Autograd kernel, so that
``torch.ops.pcops.<op>`` differentiates in reverse and forward mode (and under torch.compile,
which traces that kernel); torch.func transforms need the Function applied before the
dispatcher, which only the wrappers do, so the raw op raises under them.
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad as _forward_ad

_below_autograd = torch._C._AutoDispatchBelowAutograd
_transforms_active = torch._C._are_functorch_transforms_active
_is_wrapped = torch._C._functorch.is_gradtrackingtensor
_LIB = torch.library.Library("pcops", "IMPL")


def tracked(tensors) -> bool:
    """Whether a gradient or a tangent can flow through a call on ``tensors``: one of them
    requires grad under grad mode, a forward-AD level is open (dual tensors), or a torch.func
    transform is active (grad, jvp, vmap, jacrev, jacfwd)."""
    if _transforms_active() or _forward_ad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in tensors)


# autograd.Function of each op, by OpOverload: the wrappers apply it when tracked()
FUNCTIONS = {}


def register(name: str, function, defaults: Tuple = ()):
    """Makes ``function`` (an autograd.Function taking the op's arguments) the derivative of
    ``pcops::<name>``: the wrappers apply it (:func:`pcops._dispatch.call`), and it becomes the
    op's Autograd kernel, so that ``torch.ops.pcops.<name>`` differentiates in reverse and
    forward mode too. ``defaults``: the trailing arguments the dispatcher may leave out.

    torch.func transforms (grad, jvp, jacrev, jacfwd, hessian; vmap composed with them) need the
    Function applied before the dispatcher, which only the wrapper does: the raw op raises
    under them, naming the wrapper, instead of returning zero derivatives."""
    op = getattr(torch.ops.pcops, name).default
    FUNCTIONS[op] = function
    nargs = len(op._schema.arguments)

    def autograd_kernel(*args):
        if len(args) < nargs:  # the dispatcher drops trailing arguments equal to their defaults
            args = args + tuple(defaults[len(defaults) - (nargs - len(args)):])
        if _transforms_active() and any(
                isinstance(t, Tensor) and _is_wrapped(t) for t in args):
            raise RuntimeError(
                f"torch.ops.pcops.{name}: torch.func transforms (grad, jvp, jacrev, jacfwd, "
                f"...) reach this op only through the Python function pcops.{name}, which "
                "differentiates it in every mode; call that instead")
        if _forward_ad._current_level >= 0 or (torch.is_grad_enabled() and any(
                isinstance(t, Tensor) and t.requires_grad for t in args)):
            return function.apply(*args)
        with _below_autograd():
            return op(*args)

    autograd_kernel.__name__ = autograd_kernel.__qualname__ = f"pcops_{name}_autograd"
    _LIB.impl(name, autograd_kernel, "Autograd")


def save(ctx, op: str, **tensors):
    """Saves the named tensors for the backward and for the jvp alike (vmap's generated rules
    keep one record of batch dimensions for both), with a message naming the op and the
    argument for an inference tensor where a gradient is wanted (torch's names neither)."""
    if any(ctx.needs_input_grad):
        for name, t in tensors.items():
            if t.is_inference():
                raise RuntimeError(
                    f"pcops.{op}: argument '{name}' is an inference tensor (created under "
                    "torch.inference_mode), which autograd cannot save for the backward; pass "
                    f"{name}.clone() made outside inference mode, or call pcops.{op} under "
                    "torch.inference_mode() / torch.no_grad() if no gradient is wanted")
    ctx.save_for_backward(*tensors.values())
    ctx.save_for_forward(*tensors.values())


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for the half types (the kernels compute in it), else the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---- vmap rules of the ops -----------------------------------------------------------------


def fold_batch(batch_size: int, in_dims: Sequence[Optional[int]], args: Sequence, batched):
    """The arguments of an op with a leading batch dimension B, for one call over a vmapped
    batch of V: each tensor in ``batched`` (positions) becomes ``[V * B, ...]`` (the vmapped
    dimension moved to the front and folded into B; a tensor that is not vmapped is expanded);
    other arguments pass unchanged."""
    out = list(args)
    for i in batched:
        t = args[i] if i < len(args) else None
        if t is None:
            continue
        dim = in_dims[i]
        t = t.unsqueeze(0).expand(batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
        out[i] = t.reshape(batch_size * t.shape[1], *t.shape[2:])
    return out


def unfold_batch(batch_size: int, B: int, outputs):
    """Splits the folded ``V * B`` of each output back into ``[V, B, ...]``; returns
    ``(outputs, out_dims)`` for a vmap rule."""
    if isinstance(outputs, Tensor):
        return outputs.unflatten(0, (batch_size, B)), 0
    return tuple(o.unflatten(0, (batch_size, B)) for o in outputs), (0,) * len(outputs)


def register_fold_vmap(name: str, batched: Sequence[int]):
    """A vmap rule for ``pcops::<name>``, an op whose tensor arguments at positions ``batched``
    all have the batch dimension B first, and whose outputs do too: one call with the vmapped
    dimension folded into B."""
    op = getattr(torch.ops.pcops, name).default

    def rule(info, in_dims, *args):
        folded = fold_batch(info.batch_size, in_dims, args, batched)
        B = folded[batched[0]].shape[0] // info.batch_size
        return unfold_batch(info.batch_size, B, op(*folded))

    torch.library.register_vmap(f"pcops::{name}", rule, lib=_LIB)


def register_no_vmap(name: str, why: str):
    """A vmap rule for ``pcops::<name>`` that raises: the op cannot be batched (``why``)."""

    def rule(info, in_dims, *args):
        raise RuntimeError(f"pcops.{name}: torch.vmap is not supported: {why}")

    torch.library.register_vmap(f"pcops::{name}", rule, lib=_LIB)
