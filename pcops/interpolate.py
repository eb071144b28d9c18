"""Feature propagation (PointNet++ segmentation): ``three_nn``, ``interpolate`` /
``three_interpolate``, with the fake (meta) implementation and a deterministic autograd."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call as _call
from .group import _group, _group_backward

__all__ = ["interpolate", "three_interpolate", "three_nn"]

# idx of interpolate: int64, or int32 (read as is, without a converted copy; the backward
# hands it to group / group_backward, which take both)
_INDEX_DTYPES = (torch.long, torch.int32)


def three_nn(
    unknown: Tensor,
    known: Tensor,
    unknown_lengths: Optional[Tensor] = None,
    known_lengths: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The three nearest ``known`` points of each ``unknown`` point: ``pcops.knn`` with k = 3.

    Args:
        unknown: ``[B, M, 3]`` points to propagate features to.
        known: ``[B, N, 3]`` points that have features, same dtype and device.
        unknown_lengths, known_lengths: optional int64 ``[B]`` (ragged batches), as in
            :func:`pcops.knn`.

    Returns:
        ``(dist2, idx)``, each ``[B, M, 3]``: squared distances (sorted ascending, ties to the
        lower index) and int64 indices into ``known``; -1 / +inf where a cloud has fewer than
        3 known points. ``dist2`` is differentiable like :func:`pcops.knn`'s.

    Example (inverse-distance weights, as PointNet++ uses them):
        >>> dist2, idx = pcops.three_nn(xyz_dense, xyz_sparse)
        >>> w = 1.0 / (dist2.sqrt() + 1e-8)
        >>> w = w / w.sum(-1, keepdim=True)
        >>> feats_dense = pcops.three_interpolate(feats_sparse, idx, w)   # [B, M, C]
    """
    return _call(torch.ops.pcops.knn.default, (unknown, known), unknown, known, 3,
                 unknown_lengths, known_lengths)


def interpolate(features: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
    """Weighted gather: ``out[b, m, :] = sum_k weight[b, m, k] * features[b, idx[b, m, k], :]``.

    The feature-propagation step of PointNet++ segmentation (with the ``K = 3`` neighbours of
    :func:`three_nn` and inverse-distance weights), and any other fixed-weight interpolation.
    The products are added in ascending ``k`` from 0, so CPU and CUDA give the same bits.
    Slots with index -1 add nothing. Differentiable with respect to ``features`` and
    ``weight``; the ``features`` gradient is a scatter done by :func:`pcops.group_backward`,
    in a fixed order (the same bits on every run, no atomics).

    Args:
        features: ``[B, N, C]`` (channels last), float32/float64/float16/bfloat16 (half types
            compute in float32); need not be contiguous.
        idx: int64 or int32 ``[B, M, K]`` in ``[-1, N)`` (int32, as pointnet2_ops code holds
            them, is read without a converted copy; checked on the CPU; on CUDA only under
            :func:`pcops.set_debug_checks`, to stay free of host synchronisation: values outside
            ``[0, N)`` add nothing).
        weight: ``[B, M, K]``, the dtype of ``features``.

    Returns:
        ``[B, M, C]`` in the dtype of ``features``.

    Example:
        >>> feats = torch.randn(2, 128, 64)                          # [B, N, C] at 128 points
        >>> idx = torch.tensor([[[0, 5, -1]]]).expand(2, 1024, 3)   # [B, M, K]
        >>> weight = torch.full((2, 1024, 3), 0.5)
        >>> pcops.interpolate(feats, idx, weight).shape              # 0.5 f[0] + 0.5 f[5]
        torch.Size([2, 1024, 64])
    """
    return _call(torch.ops.pcops.interpolate.default, (features, weight), features, idx, weight)


def three_interpolate(features: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
    """:func:`interpolate` under the PointNet++ name. Channels last: ``features`` is
    ``[B, N, C]`` (``pcops.compat.pointnet2_ops.three_interpolate`` takes ``[B, C, N]``).

    Args:
        features: ``[B, N, C]`` features of the known (sparse) points.
        idx: int64 (or int32) ``[B, M, 3]`` from :func:`three_nn` (any K works; -1 adds
            nothing).
        weight: ``[B, M, 3]``, the dtype of ``features``.

    Returns:
        ``[B, M, C]``: the weighted sums, differentiable as :func:`interpolate`.

    Example:
        >>> dist2, idx = pcops.three_nn(xyz_dense, xyz_sparse)      # [B, M, 3] each
        >>> w = 1.0 / dist2.clamp_min(1e-10)                         # the paper's p = 2
        >>> w = w / w.sum(-1, keepdim=True)
        >>> feats_dense = pcops.three_interpolate(feats_sparse, idx, w)
    """
    return _call(torch.ops.pcops.interpolate.default, (features, weight), features, idx, weight)


@torch.library.register_fake("pcops::interpolate")
def _interpolate_fake(features, idx, weight):
    _checks.check_devices("interpolate", "features", features, idx=idx, weight=weight)
    torch._check(features.dim() == 3, lambda: "features must be [B, N, C]")
    torch._check(idx.dim() == 3 and idx.dtype in _INDEX_DTYPES,
                 lambda: "idx must be int64 or int32 [B, M, K]")
    torch._check(weight.shape == idx.shape, lambda: "weight must have the shape of idx")
    torch._check(weight.dtype == features.dtype, lambda: "weight must have the dtype of features")
    torch._check(idx.shape[0] == features.shape[0], lambda: "idx and features differ in B")
    B, _, C = features.shape
    return features.new_empty((B, idx.shape[1], C))


class _Interpolate(torch.autograd.Function):
    """interpolate's derivatives with respect to features and weight (see pcops/_autograd.py).
    The op is bilinear in (features, weight): its tangent is interpolate(dfeatures, idx, weight)
    + interpolate(features, idx, dweight), the op itself twice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(features, idx, weight):
        with _autograd._below_autograd():
            return torch.ops.pcops.interpolate.default(features, idx, weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        features, idx, weight = inputs
        ctx.num_points = features.shape[1]
        _autograd.save(ctx, "interpolate", features=features, idx=idx, weight=weight)

    @staticmethod
    def backward(ctx, grad):
        """d out[b,m,c] / d features[b,n,c] = sum of weight[b,m,k] over the k with idx == n: a
        scatter of grad * weight, done by group_backward (deterministic order). d out / d
        weight[b,m,k] = <grad[b,m,:], features[b, idx[b,m,k], :]> (0 where idx is -1)."""
        features, idx, weight = ctx.saved_tensors
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            rows = grad.unsqueeze(2) * weight.unsqueeze(-1)  # [B, M, K, C]
            grad_features = _group_backward(rows, idx, ctx.num_points)
        if ctx.needs_input_grad[2]:
            gathered = _group(features, idx)  # [B, M, K, C]
            grad_weight = (gathered * grad.unsqueeze(2)).sum(-1)
        return grad_features, None, grad_weight

    @staticmethod
    def jvp(ctx, dfeatures, _didx, dweight):
        features, idx, weight = ctx.saved_tensors
        out = None
        if dfeatures is not None:
            out = _interpolate(dfeatures, idx, weight)
        if dweight is not None:
            part = _interpolate(features, idx, dweight)
            out = part if out is None else out + part
        return out


def _interpolate(features: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
    """interpolate inside derivative formulas: differentiable again."""
    return _call(torch.ops.pcops.interpolate.default, (features, weight), features, idx, weight)


_autograd.register("interpolate", _Interpolate)
_autograd.register_fold_vmap("interpolate", batched=(0, 1, 2))
