"""``pytorch3d.ops`` point-cloud functions on top of the pcops ops: sample_farthest_points,
knn_points (namedtuple ``KNN(dists, idx, knn)``), knn_gather, ball_query.

Same names, argument order, defaults and padding as PyTorch3D: ``lengths`` for ragged batches,
squared distances, knn_points pads idx and dists with 0, ball_query pads idx with -1 and dists
with 0, sample_farthest_points pads idx with -1 and points with 0 and takes ``K`` as an int, a
list or a tensor per cloud. Autograd: ``dists`` of knn_points and ball_query with respect to
both clouds, the outputs of knn_gather with respect to ``x``.

Differences (see the README): none in what is computed for any D (knn_points also takes
``norm=1``; clouds with D < 3 are padded with zero coordinates for the fast 3-D paths, which
leaves every distance's bits unchanged); dtypes are kept (PyTorch3D casts FPS input to float32);
FPS distances start at +inf (PyTorch3D CUDA: 1e10); ties go to the lower index;
``return_sorted=False`` returns the K nearest in ascending index order (PyTorch3D leaves that
order unspecified; its tests check that it is not the sorted one); ``version`` is ignored.
"""
from collections import namedtuple
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._dispatch import call as _call
from ..fps import furthest_point_sample as _fps

__pcops_compat__ = True

__all__ = ["KNN", "ball_query", "knn_gather", "knn_points", "masked_gather",
           "sample_farthest_points"]

KNN = namedtuple("KNN", "dists idx knn")
_KNN = KNN


def _to_3d(points: Tensor) -> Tensor:
    """Points of D < 3 coordinates padded with zeros, for the 3-D paths (the same bits as the
    ops' search of any dimension, faster); D >= 3 as they are (D > 3: that search)."""
    D = points.shape[-1]
    return F.pad(points, (0, 3 - D)) if D < 3 else points


def _check_pair(p1: Tensor, p2: Tensor) -> None:
    if p1.shape[0] != p2.shape[0]:
        raise ValueError("pts1 and pts2 must have the same batch dimension.")
    if p1.shape[2] != p2.shape[2]:
        raise ValueError("pts1 and pts2 must have the same point dimension.")


def masked_gather(points: Tensor, idx: Tensor) -> Tensor:
    """``points [N, P, D]``, ``idx [N, K]`` or ``[N, P2, K]`` -> the gathered points
    ``[N, K, D]`` / ``[N, P2, K, D]``, zeros where idx is -1 (as ``pytorch3d.ops.utils``)."""
    if idx.dim() == 2:
        return _call(torch.ops.pcops.group.default, (points,), points, idx.unsqueeze(-1)).squeeze(2)
    return _call(torch.ops.pcops.group.default, (points,), points, idx)


def sample_farthest_points(
    points: Tensor,
    lengths: Optional[Tensor] = None,
    K: Union[int, List, Tensor] = 50,
    random_start_point: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Iterative farthest point sampling, as ``pytorch3d.ops.sample_farthest_points``.

    Args:
        points: ``[N, P, D]`` (any D).
        lengths: optional ``[N]`` number of points in each cloud.
        K: samples per cloud: an int, or a list / tensor ``[N]`` (then the outputs have
            ``max(K)`` columns, padded with -1 / 0.0; finding ``max(K)`` synchronises once,
            as in PyTorch3D).
        random_start_point: start each cloud at a uniformly random valid point (drawn on the
            device from torch's generator) instead of index 0.

    Returns:
        ``(selected_points [N, K, D], selected_indices [N, K] int64)``; indices past
        ``min(K, lengths[i])`` are -1 and their points 0.0.
    """
    N, P, D = points.shape
    if lengths is not None:
        if lengths.shape != (N,):
            raise ValueError("points and lengths must have same batch dimension.")
        lengths = lengths.to(device=points.device, dtype=torch.long)
    per_cloud = None
    if isinstance(K, int):
        max_K = K
    else:
        per_cloud = torch.as_tensor(K, dtype=torch.long, device=points.device)
        if per_cloud.dim() != 1 or per_cloud.shape[0] != N:
            raise ValueError("K and points must have the same batch dimension")
        max_K = int(per_cloud.max()) if N > 0 else 0
    if max_K < 1:
        # PyTorch3D returns empty outputs for K = 0
        return points.new_zeros((N, 0, D)), torch.empty((N, 0), dtype=torch.long,
                                                         device=points.device)
    idx = _fps(_to_3d(points.detach()), max_K, lengths, random_start=bool(random_start_point))
    if per_cloud is not None:
        cols = torch.arange(max_K, device=points.device)
        idx = idx.masked_fill(cols >= per_cloud.unsqueeze(1), -1)
    return masked_gather(points, idx), idx


def knn_points(
    p1: Tensor,
    p2: Tensor,
    lengths1: Optional[Tensor] = None,
    lengths2: Optional[Tensor] = None,
    norm: int = 2,
    K: int = 1,
    version: int = -1,
    return_nn: bool = False,
    return_sorted: bool = True,
) -> KNN:
    """K nearest neighbours of each point of ``p1 [N, P1, D]`` in ``p2 [N, P2, D]`` (any D),
    as ``pytorch3d.ops.knn_points``.

    Returns ``KNN(dists, idx, knn)``: squared distances ``[N, P1, K]`` (differentiable with
    respect to p1 and p2), int64 indices ``[N, P1, K]`` (both padded with 0 where a cloud of
    p2 has fewer than K points and for the points of p1 past lengths1), and with
    ``return_nn=True`` the neighbours ``[N, P1, K, D]`` (0.0 in padded slots), else None.
    ``norm=1``: L1 distances (the sum of absolute differences), as PyTorch3D; ``version`` is
    ignored; neighbours come sorted by distance (ties to the lower index), or with
    ``return_sorted=False`` by index (empty slots last).
    """
    _check_pair(p1, p2)
    if norm not in (1, 2):
        raise ValueError("Support for 1 or 2 norm.")
    # D < 3 is padded to the 3-D paths (zero coordinates: the same bits); D > 3 and norm=1
    # take pcops.knn's search of any dimension
    q, r = _to_3d(p1), _to_3d(p2)
    if norm == 1:
        dists, idx = _call(torch.ops.pcops.knn.default, (q, r), q, r, K, lengths1, lengths2,
                           "l1")
    else:
        dists, idx = _call(torch.ops.pcops.knn.default, (q, r), q, r, K, lengths1, lengths2)
    if not return_sorted and K > 1:  # the same neighbours by index; -1 (empty) after them
        order = idx.masked_fill(idx < 0, torch.iinfo(idx.dtype).max).argsort(dim=2)
        dists, idx = dists.gather(2, order), idx.gather(2, order)
    if lengths1 is not None or lengths2 is not None or K > p2.shape[1]:
        # pcops pads with -1 / +inf, PyTorch3D with 0 / 0 (no host synchronisation here)
        empty = idx < 0
        dists = dists.masked_fill(empty, 0.0)
        idx = idx.masked_fill(empty, 0)
    nn = knn_gather(p2, idx, lengths2) if return_nn else None
    return KNN(dists=dists, idx=idx, knn=nn)


def knn_gather(x: Tensor, idx: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
    """``x [N, M, U]``, ``idx [N, L, K]`` -> ``[N, L, K, U]``, ``out[n, l, k] = x[n, idx[n, l,
    k]]``, 0.0 where ``k >= lengths[n]`` (as ``pytorch3d.ops.knn_gather``). Differentiable
    with respect to ``x`` (deterministic backward)."""
    N, M, U = x.shape
    _N, L, K = idx.shape
    if N != _N:
        raise ValueError("x and idx must have same batch dimension.")
    if lengths is not None:
        cols = torch.arange(K, device=idx.device)
        idx = idx.masked_fill(cols >= lengths.to(idx.device)[:, None, None], -1)
    return _call(torch.ops.pcops.group.default, (x,), x, idx)


def ball_query(
    p1: Tensor,
    p2: Tensor,
    lengths1: Optional[Tensor] = None,
    lengths2: Optional[Tensor] = None,
    K: int = 500,
    radius: float = 0.2,
    return_nn: bool = True,
) -> KNN:
    """The first ``K`` points of ``p2`` (index order) with squared distance ``< radius**2``
    from each point of ``p1``, as ``pytorch3d.ops.ball_query``.

    Returns ``KNN(dists, idx, knn)``: squared distances ``[N, P1, K]`` (0 in empty slots;
    differentiable with respect to p1 and p2), int64 idx ``[N, P1, K]`` (-1 in empty slots)
    and, with ``return_nn``, the neighbours ``[N, P1, K, D]`` (0.0 in empty slots).
    """
    _check_pair(p1, p2)
    D = p2.shape[2]
    q, r = _to_3d(p1), _to_3d(p2)
    # one op: PyTorch3D's -1 padding and the search's own squared distances (0 in empty
    # slots), differentiable with respect to both clouds
    dists, idx = _call(torch.ops.pcops.ball_query_dist2.default, (q, r), q, r, float(radius), K,
                       lengths1, lengths2)
    knn = None
    if return_nn:
        nn = _call(torch.ops.pcops.group.default, (r,), r, idx)  # zeros in empty slots
        knn = nn if D >= 3 else nn[..., :D]
    return KNN(dists=dists, idx=idx, knn=knn)
