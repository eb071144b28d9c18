"""``torch_cluster`` point-cloud functions on top of the pcops ops: fps, knn, knn_graph,
radius, radius_graph.

Same API as torch_cluster: flat points ``[N, D]`` with an optional sorted batch vector
(``batch``, ``batch_x``, ``batch_y``: cloud id per point), global int64 indices, COO
``edge_index [2, E]`` outputs (``row`` = index into ``y``, ``col`` = index into ``x`` for knn /
radius; ``flow`` decides the direction of the graphs), ``max_num_neighbors`` (the first ones
in index order, as torch_cluster's CUDA code), ``loop``, ``batch_size``. Unsorted batch
vectors raise ValueError ("'batch_x' is not sorted"), as recent torch_cluster does; clouds
with no points (empty batches) are fine.

Output sizes depend on the data, so these functions synchronise with the host, as
torch_cluster's do. Batched calls repack the flat points into a padded ``[B, L, 3]`` batch
(one copy of the points) and call the pcops op once.

Differences (see the README): D <= 3 (fewer coordinates are padded with zeros; D > 3 raises
NotImplementedError), ``cosine=True`` raises NotImplementedError; FPS distances start at +inf
(torch_cluster's CUDA FPS starts them at 5e4, so on clouds wider than ~224 units it samples
in index order) and kNN has no 1e10 sentinel (torch_cluster drops neighbours farther than 1e5
units) nor a k <= 100 limit; ties go to the lower index on CPU and CUDA.
"""
import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..fps import furthest_point_sample as _fps

__pcops_compat__ = True

__all__ = ["fps", "knn", "knn_graph", "radius", "radius_graph"]


def _points(x: Tensor, fn: str, arg: str) -> Tensor:
    x = x.view(-1, 1) if x.dim() == 1 else x
    if x.dim() != 2:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' must be [N, D], "
                         f"got shape {list(x.shape)}")
    D = x.shape[1]
    if D > 3:
        raise NotImplementedError(
            f"pcops.compat.torch_cluster.{fn}: argument '{arg}' has D = {D} features; pcops "
            "implements D <= 3 (point coordinates). Use the real torch_cluster for feature "
            "spaces."
        )
    return F.pad(x, (0, 3 - D)) if D < 3 else x


def _check_batch(batch: Optional[Tensor], n: int, fn: str, arg: str) -> None:
    if batch is None:
        return
    if batch.dim() != 1 or batch.numel() != n:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' must be [N] with "
                         f"N = {n}, got shape {list(batch.shape)}")
    if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError(f"'{arg}' is not sorted")
    if batch.numel() > 0 and int(batch[0]) < 0:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' holds negative "
                         "cloud ids")


def _pack(x: Tensor, batch: Tensor, B: int):
    """Flat points and a sorted batch vector -> (padded [B, L, 3], lengths [B], ptr [B+1],
    pos [N] (the row of each point in its cloud))."""
    counts = torch.bincount(batch, minlength=B)[:B]
    ptr = F.pad(counts.cumsum(0), (1, 0))
    L = int(counts.max()) if B > 0 else 0
    pos = torch.arange(x.shape[0], device=x.device) - ptr[batch]
    # index_copy_ on the flattened rows (advanced-index assignment is ~400x slower on the CPU)
    padded = x.new_zeros((B * L, x.shape[1])).index_copy_(0, batch * L + pos, x)
    return padded.view(B, L, x.shape[1]), counts, ptr, pos


def _batch_size(batch_size: Optional[int], *batches: Optional[Tensor]) -> int:
    if batch_size is not None:
        return int(batch_size)
    size = 1
    for b in batches:
        if b is not None and b.numel() > 0:
            size = max(size, int(b[-1]) + 1)  # sorted: the last id is the largest
    return size


def _samples(n: int, ratio: float, dtype: torch.dtype) -> int:
    """ceil(n * ratio) rounded as torch_cluster computes it, in the dtype of the points (in
    float32 0.3 * 30 is 9.0000003 -> 10 samples), without creating a tensor."""
    if dtype == torch.float64:
        return math.ceil(float(n) * ratio)
    if dtype == torch.float32:
        return math.ceil(float(np.float32(n) * np.float32(ratio)))
    return int(torch.ceil(torch.tensor(float(n), dtype=dtype) * torch.tensor(ratio, dtype=dtype)))


def fps(
    src: Tensor,
    batch: Optional[Tensor] = None,
    ratio: float = 0.5,
    random_start: bool = True,
    batch_size: Optional[int] = None,
    ptr: Optional[Tensor] = None,
) -> Tensor:
    """Farthest point sampling of ``ceil(ratio * n_b)`` points of each cloud ``b`` of
    ``src [N, D]`` -> int64 global indices, cloud after cloud (as ``torch_cluster.fps``).

    ``ratio`` in (0, 1] (a float or a 0-d tensor); ``random_start`` starts each cloud at a
    random point (default, as there), else at its first point; ``ptr`` (cloud offsets
    ``[B + 1]``) may replace ``batch``.
    """
    x = _points(src, "fps", "src")
    r = float(ratio)  # a Python scalar: multiplied in the dtype of src, as torch_cluster does
    if not 0 < r <= 1:
        raise ValueError(f"pcops.compat.torch_cluster.fps: 'ratio' must be in (0, 1], got {ratio}")
    if ptr is not None:
        ptr = ptr.to(device=x.device, dtype=torch.long)
        counts = ptr[1:] - ptr[:-1]
        batch = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts)
    _check_batch(batch, x.shape[0], "fps", "batch")
    if batch is None:
        n = x.shape[0]
        k = _samples(n, r, x.dtype)
        if k == 0:
            return torch.empty(0, dtype=torch.long, device=x.device)
        idx = _fps(x.detach().unsqueeze(0), k, None, random_start=bool(random_start))
        return idx[0]
    B = _batch_size(batch_size, batch)
    padded, counts, ptr_vec, _ = _pack(x.detach(), batch, B)
    # samples per cloud, computed as torch_cluster does (in the dtype of src)
    per_cloud = torch.ceil(counts.to(x.dtype) * torch.tensor(r, dtype=x.dtype)).long()
    K = int(per_cloud.max()) if B > 0 else 0
    if K == 0:
        return torch.empty(0, dtype=torch.long, device=x.device)
    idx = _fps(padded, K, counts, random_start=bool(random_start))
    keep = torch.arange(K, device=x.device) < per_cloud.unsqueeze(1)
    return (idx + ptr_vec[:-1].unsqueeze(1))[keep]


def _neighbours(op, x, y, batch_x, batch_y, batch_size, fn, *args):
    """Runs `op(query, ref, *args, query_lengths, ref_lengths)` on the clouds of y (queries)
    and x (refs); returns (local idx [M, S] into the cloud, count-or-None, x offset [M])."""
    B = _batch_size(batch_size, batch_x, batch_y)
    if B == 1:  # one cloud (sorted, non-negative ids whose largest is 0): no repacking
        out = op(y.unsqueeze(0), x.unsqueeze(0), *args)
        return out[0][0], out[1][0], None
    if batch_x is None:
        batch_x = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    if batch_y is None:
        batch_y = torch.zeros(y.shape[0], dtype=torch.long, device=y.device)
    xp, x_len, x_ptr, _ = _pack(x, batch_x, B)
    yp, y_len, _, y_pos = _pack(y, batch_y, B)
    if xp.shape[1] == 0:  # no reference points at all
        S = args[-1]
        empty = torch.full((y.shape[0], S), -1, dtype=torch.long, device=x.device)
        return empty, torch.zeros(y.shape[0], dtype=torch.long, device=x.device), None
    out = op(yp, xp, *args, y_len, x_len)
    first, second = out[0][batch_y, y_pos], out[1][batch_y, y_pos]
    return first, second, x_ptr[batch_y]


def knn(
    x: Tensor,
    y: Tensor,
    k: int,
    batch_x: Optional[Tensor] = None,
    batch_y: Optional[Tensor] = None,
    cosine: bool = False,
    num_workers: int = 1,
    batch_size: Optional[int] = None,
) -> Tensor:
    """For each point of ``y`` its ``k`` nearest points of ``x`` in the same cloud ->
    ``edge_index [2, E]``: ``row`` indexes ``y``, ``col`` indexes ``x``, grouped by ``y`` and
    sorted by distance (ties to the lower index); fewer than ``k`` where a cloud of ``x`` is
    smaller. ``num_workers`` is ignored (the CPU kernels use OpenMP)."""
    if cosine:
        raise NotImplementedError(
            "pcops.compat.torch_cluster.knn: cosine=True is not implemented; pcops uses the "
            "Euclidean distance. Normalise the points and use Euclidean kNN (same order), or "
            "the real torch_cluster."
        )
    xs, ys = _points(x, "knn", "x"), _points(y, "knn", "y")
    _check_batch(batch_x, xs.shape[0], "knn", "batch_x")
    _check_batch(batch_y, ys.shape[0], "knn", "batch_y")
    M = ys.shape[0]
    if M == 0 or xs.shape[0] == 0:
        return torch.empty((2, 0), dtype=torch.long, device=xs.device)

    def op(query, ref, k_, ql=None, rl=None):
        dist2, idx = torch.ops.pcops.knn.default(query.detach(), ref.detach(), k_, ql, rl)
        return idx, dist2

    idx, _, offset = _neighbours(op, xs, ys, batch_x, batch_y, batch_size, "knn", k)
    rows = torch.arange(M, device=xs.device).unsqueeze(1).expand_as(idx)
    if offset is None and k <= xs.shape[0]:
        return torch.stack([rows.reshape(-1), idx.reshape(-1)])  # every slot is filled
    valid = idx >= 0
    col = idx if offset is None else idx + offset.unsqueeze(1)
    return torch.stack([rows[valid], col[valid]])


def knn_graph(
    x: Tensor,
    k: int,
    batch: Optional[Tensor] = None,
    loop: bool = False,
    flow: str = "source_to_target",
    cosine: bool = False,
    num_workers: int = 1,
    batch_size: Optional[int] = None,
) -> Tensor:
    """The k-nearest-neighbour graph of ``x`` within each cloud -> ``edge_index [2, E]``;
    ``flow="source_to_target"`` gives edges neighbour -> point. Without ``loop`` the ``k + 1``
    nearest are searched and the point itself removed, as torch_cluster does."""
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError("'flow' must be 'source_to_target' or 'target_to_source'")
    edge_index = knn(x, x, k if loop else k + 1, batch, batch, cosine, num_workers, batch_size)
    if flow == "source_to_target":
        row, col = edge_index[1], edge_index[0]
    else:
        row, col = edge_index[0], edge_index[1]
    if not loop:
        mask = row != col
        row, col = row[mask], col[mask]
    return torch.stack([row, col], dim=0)


def radius(
    x: Tensor,
    y: Tensor,
    r: float,
    batch_x: Optional[Tensor] = None,
    batch_y: Optional[Tensor] = None,
    max_num_neighbors: int = 32,
    num_workers: int = 1,
    batch_size: Optional[int] = None,
    ignore_same_index: bool = False,
) -> Tensor:
    """For each point of ``y`` the first ``max_num_neighbors`` points of ``x`` (index order)
    in the same cloud with squared distance ``< r**2`` -> ``edge_index [2, E]`` (``row``
    indexes ``y``, ``col`` indexes ``x``). ``ignore_same_index`` skips ``x[i]`` for ``y[i]``
    (and does not count it), as torch_cluster does for ``radius_graph(loop=False)``."""
    xs, ys = _points(x, "radius", "x"), _points(y, "radius", "y")
    _check_batch(batch_x, xs.shape[0], "radius", "batch_x")
    _check_batch(batch_y, ys.shape[0], "radius", "batch_y")
    M = ys.shape[0]
    if M == 0 or xs.shape[0] == 0 or max_num_neighbors < 1:
        return torch.empty((2, 0), dtype=torch.long, device=xs.device)
    S = max_num_neighbors + (1 if ignore_same_index else 0)

    def op(query, ref, r_, s_, ql=None, rl=None):
        return torch.ops.pcops.ball_query.default(query.detach(), ref.detach(), r_, s_, ql, rl)

    idx, count, offset = _neighbours(op, xs, ys, batch_x, batch_y, batch_size, "radius",
                                     float(r), S)
    valid = torch.arange(S, device=xs.device) < count.unsqueeze(1)
    col = idx if offset is None else idx + offset.unsqueeze(1)
    rows = torch.arange(M, device=xs.device).unsqueeze(1).expand_as(idx)
    if ignore_same_index:
        valid &= col != rows
        valid &= valid.long().cumsum(1) <= max_num_neighbors
    return torch.stack([rows[valid], col[valid]])


def radius_graph(
    x: Tensor,
    r: float,
    batch: Optional[Tensor] = None,
    loop: bool = False,
    max_num_neighbors: int = 32,
    flow: str = "source_to_target",
    num_workers: int = 1,
    batch_size: Optional[int] = None,
) -> Tensor:
    """The graph of points within ``r`` of each other in each cloud -> ``edge_index [2, E]``;
    without ``loop`` a point is not its own neighbour and does not count towards
    ``max_num_neighbors``, as in torch_cluster."""
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError("'flow' must be 'source_to_target' or 'target_to_source'")
    edge_index = radius(x, x, r, batch, batch, max_num_neighbors, num_workers, batch_size,
                        not loop)
    if flow == "source_to_target":
        row, col = edge_index[1], edge_index[0]
    else:
        row, col = edge_index[0], edge_index[1]
    return torch.stack([row, col], dim=0)
