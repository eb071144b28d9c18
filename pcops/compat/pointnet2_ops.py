"""``pointnet2_ops.pointnet2_utils`` (Pointnet2_PyTorch) on top of the pcops ops.

Same names, argument order, shapes and dtypes as there: channels-first features ``[B, C, N]``,
int32 indices out of ``furthest_point_sample``, ``ball_query`` and ``three_nn`` (int32 or
int64 accepted in), ``ball_query``'s padding (empty slots repeat the first neighbour; a query
with no neighbour gets index 0 everywhere), ``three_nn`` returning Euclidean (not squared)
distances, autograd for ``gather_operation``, ``grouping_operation`` and
``three_interpolate`` with respect to the features.

Differences (all documented in the README):
- ``furthest_point_sample`` never skips points near the origin (pointnet2_ops ignores every
  point with ``x*x + y*y + z*z <= 1e-3``, so a cloud centred at 0 loses its centre) and its
  distances start at +inf (pointnet2_ops: 1e10, wrong past ~1e5 units). With
  ``npoint > N`` the slots past N hold -1 (pointnet2_ops repeats index 0).
- CPU as well as CUDA, and float64 / float16 / bfloat16 as well as float32.
- Outputs of ``gather_operation``, ``grouping_operation`` and ``three_interpolate`` are
  channels-first views of channels-last results (no extra copy): call ``.contiguous()``
  before ``.view()`` on them (``torch.cat``, convolutions and in-place ops work as they are).
- ``three_interpolate`` also returns a gradient for ``weight`` (pointnet2_ops: None), and its
  ``features`` gradient is deterministic (pointnet2_ops: atomicAdd).
- Ties: the lower index wins everywhere (pointnet2_ops's FPS reduction may pick either).
"""
from typing import Tuple

import torch
from torch import Tensor, nn

from .._dispatch import call as _call
from ._util import nograd as _nograd

__pcops_compat__ = True

__all__ = [
    "GroupAll",
    "QueryAndGroup",
    "ball_query",
    "furthest_point_sample",
    "gather_operation",
    "grouping_operation",
    "three_interpolate",
    "three_nn",
]


def _group_index(idx: Tensor) -> Tensor:
    """group and interpolate read int32 (what pointnet2_ops hands in) and int64 as they are."""
    return idx if idx.dtype in (torch.int32, torch.long) else idx.long()


def furthest_point_sample(xyz: Tensor, npoint: int) -> Tensor:
    """Greedy farthest point sampling from index 0: ``xyz [B, N, 3]`` -> int32 ``[B, npoint]``."""
    idx, _ = torch.ops.pcops.furthest_point_sample.default(_nograd(xyz), npoint)
    return idx.to(torch.int32)


def _group(features: Tensor, idx: Tensor) -> Tensor:
    return _call(torch.ops.pcops.group.default, (features,), features, idx)


def gather_operation(features: Tensor, idx: Tensor) -> Tensor:
    """``features [B, C, N]``, ``idx [B, npoint]`` -> ``[B, C, npoint]``, differentiable with
    respect to ``features``."""
    out = _group(features.transpose(1, 2), _group_index(idx).unsqueeze(-1))
    return out.squeeze(2).transpose(1, 2)  # [B, npoint, 1, C] -> [B, C, npoint]


def grouping_operation(features: Tensor, idx: Tensor) -> Tensor:
    """``features [B, C, N]``, ``idx [B, npoint, nsample]`` -> ``[B, C, npoint, nsample]``,
    differentiable with respect to ``features`` (deterministic backward)."""
    out = _group(features.transpose(1, 2), _group_index(idx))
    return out.permute(0, 3, 1, 2)


def _ball_query_long(radius: float, nsample: int, xyz: Tensor, new_xyz: Tensor):
    idx, count = torch.ops.pcops.ball_query.default(
        _nograd(new_xyz), _nograd(xyz), float(radius), nsample
    )
    return idx.clamp_(min=0), count  # pointnet2_ops: a query with no neighbour gets index 0


def ball_query(radius: float, nsample: int, xyz: Tensor, new_xyz: Tensor) -> Tensor:
    """The first ``nsample`` points of ``xyz [B, N, 3]`` within ``radius`` (squared distance
    ``< radius**2``) of each centre of ``new_xyz [B, npoint, 3]``, in index order ->
    int32 ``[B, npoint, nsample]``; empty slots repeat the first neighbour, a centre with no
    neighbour gets 0 everywhere (as in pointnet2_ops)."""
    idx, _ = _ball_query_long(radius, nsample, xyz, new_xyz)
    return idx.to(torch.int32)


def three_nn(unknown: Tensor, known: Tensor) -> Tuple[Tensor, Tensor]:
    """The three nearest points of ``known [B, m, 3]`` for each point of ``unknown [B, n, 3]``
    -> ``(dist, idx)``, ``[B, n, 3]`` each: Euclidean distances (the square root of the squared
    ones, as pointnet2_ops returns them), sorted, and int32 indices. Not differentiable (as
    there). With fewer than 3 known points the missing slots hold index 0 and distance inf.

    One dispatch: the op ``three_nn_pointnet2`` is the kNN with k = 3 and the conversion
    (correctly rounded square roots, int32 indices) in one call, and takes inputs that require
    grad as they are."""
    return torch.ops.pcops.three_nn_pointnet2.default(unknown, known)


def three_interpolate(features: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
    """``features [B, C, m]``, ``idx [B, n, 3]``, ``weight [B, n, 3]`` -> ``[B, C, n]``,
    ``out[b, :, i] = sum_k weight[b, i, k] * features[b, :, idx[b, i, k]]``. Differentiable
    with respect to ``features`` (deterministic) and ``weight``."""
    f = features.transpose(1, 2)
    out = _call(torch.ops.pcops.interpolate.default, (f, weight), f, _group_index(idx), weight)
    return out.transpose(1, 2)


class QueryAndGroup(nn.Module):
    """Ball query + grouping of a set abstraction, as ``pointnet2_utils.QueryAndGroup``.

    Args:
        radius, nsample: of the ball query.
        use_xyz: put the relative coordinates in front of the features.
        ret_grouped_xyz: also return the grouped relative coordinates (VoteNet's variant).
        normalize_xyz: divide the relative coordinates by ``radius`` (VoteNet's variant).
        sample_uniformly: not supported (NotImplementedError).
        ret_unique_cnt: also return the number of distinct neighbours ``[B, npoint]``.

    ``forward(xyz [B, N, 3], new_xyz [B, npoint, 3], features [B, C, N] = None)`` ->
    ``[B, 3 + C, npoint, nsample]`` (or ``[B, C, ...]`` / ``[B, 3, ...]``), then the extras
    asked for, in the order (new_features, grouped_xyz, unique_cnt).
    """

    def __init__(
        self,
        radius: float,
        nsample: int,
        use_xyz: bool = True,
        ret_grouped_xyz: bool = False,
        normalize_xyz: bool = False,
        sample_uniformly: bool = False,
        ret_unique_cnt: bool = False,
    ):
        super().__init__()
        if sample_uniformly:
            raise NotImplementedError(
                "pcops.compat.pointnet2_ops.QueryAndGroup: sample_uniformly=True is not "
                "supported; pcops.ball_query returns the first neighbours in index order"
            )
        self.radius, self.nsample, self.use_xyz = radius, nsample, use_xyz
        self.ret_grouped_xyz, self.normalize_xyz = ret_grouped_xyz, normalize_xyz
        self.ret_unique_cnt = ret_unique_cnt

    def forward(self, xyz: Tensor, new_xyz: Tensor, features: Tensor = None):
        idx, count = _ball_query_long(self.radius, self.nsample, xyz, new_xyz)
        # channels last until the end: [B, npoint, nsample, 3]
        grouped_xyz = _group(xyz, idx) - new_xyz.unsqueeze(2)
        if self.normalize_xyz:
            grouped_xyz = grouped_xyz / self.radius
        grouped_xyz = grouped_xyz.permute(0, 3, 1, 2)  # [B, 3, npoint, nsample]
        if features is not None:
            grouped = _group(features.transpose(1, 2), idx)
            grouped = grouped.permute(0, 3, 1, 2)  # [B, C, npoint, nsample]
            new_features = torch.cat([grouped_xyz, grouped], dim=1) if self.use_xyz else grouped
        else:
            if not self.use_xyz:
                raise ValueError("Cannot have not features and not use xyz as a feature!")
            new_features = grouped_xyz
        if not (self.ret_grouped_xyz or self.ret_unique_cnt):
            return new_features
        ret = [new_features]
        if self.ret_grouped_xyz:
            ret.append(grouped_xyz)
        if self.ret_unique_cnt:
            ret.append(count)
        return tuple(ret)


class GroupAll(nn.Module):
    """Groups all points into one set, as ``pointnet2_utils.GroupAll``: ``forward(xyz
    [B, N, 3], new_xyz (ignored), features [B, C, N] = None)`` -> ``[B, 3 + C, 1, N]``
    (coordinates not centred, as there); ``ret_grouped_xyz`` also returns ``[B, 3, 1, N]``."""

    def __init__(self, use_xyz: bool = True, ret_grouped_xyz: bool = False):
        super().__init__()
        self.use_xyz, self.ret_grouped_xyz = use_xyz, ret_grouped_xyz

    def forward(self, xyz: Tensor, new_xyz: Tensor = None, features: Tensor = None):
        grouped_xyz = xyz.transpose(1, 2).unsqueeze(2)
        if features is not None:
            grouped = features.unsqueeze(2)
            new_features = torch.cat([grouped_xyz, grouped], dim=1) if self.use_xyz else grouped
        else:
            new_features = grouped_xyz
        if self.ret_grouped_xyz:
            return new_features, grouped_xyz
        return new_features
