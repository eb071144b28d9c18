"""Group (gather neighbour features): wrappers, fake (meta) implementations and autograd."""
import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call as _call

__all__ = ["group", "group_backward"]

# idx of group and group_backward: int64, or int32 (read as is, without a converted copy)
_INDEX_DTYPES = (torch.long, torch.int32)


def group(features: Tensor, idx: Tensor) -> Tensor:
    """Gathers the features of each group's neighbours:
    ``out[b, m, s, :] = features[b, idx[b, m, s], :]``.

    The step between a neighbour search (``pcops.ball_query``, ``pcops.knn``) and the shared MLP
    of a PointNet++ set abstraction. Slots with index -1 (no neighbour) come out as zeros.
    Differentiable with respect to ``features``; the backward (:func:`group_backward`) adds the
    gradients of each point in a fixed order, so it gives the same bits on every run and on
    CPU and CUDA (no atomics), unlike the atomicAdd backwards of other libraries.

    Args:
        features: ``[B, N, C]`` per-point features (channels last), float32/float64/float16/
            bfloat16, on the CPU or CUDA; need not be contiguous.
        idx: int64 or int32 ``[B, M, S]`` indices in ``[-1, N)`` (int32, as pointnet2_ops
            code holds them, is read without a converted copy). Checked on the CPU; on CUDA only
            under :func:`pcops.set_debug_checks` (a check there is a host synchronisation), and
            otherwise any value outside ``[0, N)`` reads as -1 (zeros).

    Returns:
        ``[B, M, S, C]`` in the dtype of ``features``.

    Example:
        >>> xyz = torch.rand(2, 1024, 3)
        >>> centres = xyz[:, :128]
        >>> idx = pcops.ball_query(centres, xyz, 0.2, 32)           # [2, 128, 32]
        >>> local = pcops.group(xyz, idx) - centres[:, :, None]     # [2, 128, 32, 3]
    """
    return _call(torch.ops.pcops.group.default, (features,), features, idx)


def group_backward(grad_out: Tensor, idx: Tensor, num_points: int) -> Tensor:
    """The backward of :func:`group`: ``grad_features[b, n, :]`` is the sum of
    ``grad_out[b, m, s, :]`` over the ``(m, s)`` with ``idx[b, m, s] == n``.

    The rows are added in ascending ``(m, s)`` order starting from 0, in float32 for half
    types (float64 for float64): the result is the same bits on every run and on CPU and CUDA.
    Slots with index -1 add nothing. Differentiable with respect to ``grad_out`` (its backward
    is :func:`group`).

    Args:
        grad_out: ``[B, M, S, C]``, float32/float64/float16/bfloat16.
        idx: int64 or int32 ``[B, M, S]`` indices in ``[-1, num_points)``, checked as in
            :func:`group`; unchecked values outside ``[0, num_points)`` add nothing.
        num_points: ``N >= 0``, the number of points of the features that were grouped.

    Returns:
        ``[B, num_points, C]`` in the dtype of ``grad_out``.

    Example:
        >>> idx = torch.tensor([[[0, 2], [2, -1]]])                 # B=1, M=2, S=2
        >>> g = torch.ones(1, 2, 2, 4)                               # C=4
        >>> pcops.group_backward(g, idx, num_points=3)[0, :, 0]     # point 2 was gathered twice
        tensor([1., 0., 2.])
    """
    return _call(torch.ops.pcops.group_backward.default, (grad_out,), grad_out, idx, num_points)


@torch.library.register_fake("pcops::group")
def _group_fake(features, idx):
    _checks.check_devices("group", "features", features, idx=idx)
    torch._check(features.dim() == 3, lambda: "features must be [B, N, C]")
    torch._check(idx.dim() == 3 and idx.dtype in _INDEX_DTYPES,
                 lambda: "idx must be int64 or int32 [B, M, S]")
    torch._check(idx.shape[0] == features.shape[0], lambda: "idx and features differ in B")
    B, _, C = features.shape
    _, M, S = idx.shape
    return features.new_empty((B, M, S, C))


@torch.library.register_fake("pcops::group_backward")
def _group_backward_fake(grad_out, idx, num_points):
    _checks.check_devices("group_backward", "grad_out", grad_out, idx=idx)
    torch._check(grad_out.dim() == 4, lambda: "grad_out must be [B, M, S, C]")
    torch._check(idx.dim() == 3 and idx.dtype in _INDEX_DTYPES,
                 lambda: "idx must be int64 or int32 [B, M, S]")
    torch._check(num_points >= 0, lambda: "num_points must be >= 0")
    B, _, _, C = grad_out.shape
    return grad_out.new_empty((B, num_points, C))


class _Group(torch.autograd.Function):
    """group's derivatives (see pcops/_autograd.py). group is linear in features: its tangent is
    group of the tangent, its backward group_backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(features, idx):
        with _autograd._below_autograd():
            return torch.ops.pcops.group.default(features, idx)

    @staticmethod
    def setup_context(ctx, inputs, output):
        features, idx = inputs
        ctx.num_points = features.shape[1]
        _autograd.save(ctx, "group", idx=idx)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None
        (idx,) = ctx.saved_tensors
        return _group_backward(grad, idx, ctx.num_points), None

    @staticmethod
    def jvp(ctx, dfeatures, _didx):
        (idx,) = ctx.saved_tensors
        return _group(dfeatures, idx)


class _GroupBackward(torch.autograd.Function):
    """group_backward's derivatives: it is linear in grad_out, with group as its adjoint."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad_out, idx, num_points):
        with _autograd._below_autograd():
            return torch.ops.pcops.group_backward.default(grad_out, idx, num_points)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, idx, num_points = inputs
        ctx.num_points = num_points
        _autograd.save(ctx, "group_backward", idx=idx)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (idx,) = ctx.saved_tensors
        return _group(grad, idx), None, None

    @staticmethod
    def jvp(ctx, dgrad_out, _didx, _dnum_points):
        (idx,) = ctx.saved_tensors
        return _group_backward(dgrad_out, idx, ctx.num_points)


def _group(features: Tensor, idx: Tensor) -> Tensor:
    """group inside derivative formulas: differentiable again (double backward, transforms)."""
    return _call(torch.ops.pcops.group.default, (features,), features, idx)


def _group_backward(grad_out: Tensor, idx: Tensor, num_points: int) -> Tensor:
    return _call(torch.ops.pcops.group_backward.default, (grad_out,), grad_out, idx, num_points)


_autograd.register("group", _Group)
_autograd.register("group_backward", _GroupBackward)
_autograd.register_fold_vmap("group", batched=(0, 1))
_autograd.register_fold_vmap("group_backward", batched=(0, 1))
