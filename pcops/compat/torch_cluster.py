"""``torch_cluster`` point-cloud functions on top of the pcops ops: fps, knn, knn_graph,
radius, radius_graph.

Same API as torch_cluster: flat points ``[N, D]`` with an optional sorted batch vector
(``batch``, ``batch_x``, ``batch_y``: cloud id per point), global int64 indices, COO
``edge_index [2, E]`` outputs (``row`` = index into ``y``, ``col`` = index into ``x`` for knn /
radius; ``flow`` decides the direction of the graphs), ``max_num_neighbors`` (the first ones
in index order, as torch_cluster's CUDA code), ``loop``, ``batch_size``. Unsorted batch
vectors raise ValueError ("'batch_x' is not sorted"), as recent torch_cluster does; clouds
with no points (empty batches) are fine.

Output sizes depend on the data, so these functions synchronise with the host: fps once per
call, knn / radius of one cloud once (inside the ``pcops.neighbor_edges`` op that compacts the
neighbour slots into ``edge_index``), batched knn / radius twice (the clouds' sizes, then the
edge count); torch_cluster's fps and radius synchronise twice. The batch vectors' checks ride
on the first copy. fps with a batch vector dispatches one op before its synchronisation
(``pcops::_fps_layout``: the checks, the largest cloud, the number of samples, and per point
its place in the output, computed on the device), then reads its six stats. Batched calls
repack the flat points into a padded ``[B, L, 3]`` batch (one gather of the points, located by
binary searches of the sorted batch vector on the device) and call the pcops op once; fps
over clouds of one size uses the flat points as they are (a view). The host work after a
synchronisation is kept to the least: the FPS launch, or nothing (the edge compaction
finishes inside its op).

Differences (see the README): fps, knn and radius take any D (fewer than 3 coordinates are
padded with zeros for the 3-D paths, which leaves every distance unchanged), knn also
``cosine=True`` (1 - cos, 1 for a zero vector); FPS distances start at +inf
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

from .._dispatch import call as _call
from ..fps import furthest_point_sample as _fps
from ._util import nograd as _nograd

__pcops_compat__ = True

__all__ = ["fps", "knn", "knn_graph", "radius", "radius_graph"]


def _points(x: Tensor, fn: str, arg: str) -> Tensor:
    x = x.view(-1, 1) if x.dim() == 1 else x
    if x.dim() != 2:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' must be [N, D], "
                         f"got shape {list(x.shape)}")
    D = x.shape[1]
    if D > 3:  # the ops' kernels of any dimension
        return x
    # D < 3: zero coordinates leave every distance's bits unchanged, and the 3-D paths are the
    # fast ones
    return F.pad(x, (0, 3 - D)) if D < 3 else x


def _check_batch(batch: Optional[Tensor], n: int, fn: str, arg: str) -> None:
    """Shape checks (no synchronisation); the values are checked by `_layout`."""
    if batch is None:
        return
    if batch.dim() != 1 or batch.numel() != n:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' must be [N] with "
                         f"N = {n}, got shape {list(batch.shape)}")


def _check_batch_values(batch: Tensor, fn: str, arg: str) -> None:
    """The exact value checks, on the host: only run once `_layout` has seen a bad vector."""
    if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError(f"'{arg}' is not sorted")
    if batch.numel() > 0 and int(batch[0]) < 0:
        raise ValueError(f"pcops.compat.torch_cluster.{fn}: argument '{arg}' holds negative "
                         "cloud ids")


def _cloud_bounds(batch: Tensor):
    """Per point of a sorted batch vector, the first point of its cloud and one past its last
    (binary searches on the device, no synchronisation)."""
    return torch.searchsorted(batch, batch), torch.searchsorted(batch, batch, right=True)


def _layout(fn: str, batches, values):
    """The one host synchronisation of a batched call: `values` (0-d int64 device tensors)
    and, for each `(name, batch)` of `batches`, its last cloud id and a value < 0 when it is
    unsorted or holds negative ids (its first id, or its smallest step), fetched in one copy.
    Raises the ValueError of the first bad vector. Returns (last ids, values)."""
    checks = []
    for _, batch in batches:
        steps = (batch[1:] - batch[:-1]).min() if batch.numel() > 1 else batch[0]
        checks += [steps, batch[0], batch[-1]]
    got = torch.stack(checks + list(values)).tolist()
    for i, (name, batch) in enumerate(batches):
        if min(got[3 * i], got[3 * i + 1]) < 0:
            _check_batch_values(batch, fn, name)
    return got[2:3 * len(batches):3], got[3 * len(batches):]


def _pack(x: Tensor, batch: Tensor, B: int, L: int):
    """Flat points and a sorted batch vector -> (padded [B, L, D], lengths [B], ptr [B+1]),
    with L at least the largest cloud. Rows past a cloud's length hold copies of other points
    (the ops read only the first `lengths[b]`): one gather, no fill."""
    ptr = torch.searchsorted(batch, torch.arange(B + 1, device=x.device))
    src = (ptr[:-1].unsqueeze(1) + torch.arange(L, device=x.device)).clamp_(max=x.shape[0] - 1)
    return x[src], ptr.diff(), ptr


def _batch_size(batch_size: Optional[int], last_ids) -> int:
    if batch_size is not None:
        return int(batch_size)
    return max([1] + [int(last) + 1 for last in last_ids])


def _samples(n: int, ratio: float, dtype: torch.dtype) -> int:
    """ceil(n * ratio) rounded as torch_cluster computes it, in the dtype of the points (in
    float32 50 * 0.3 is 15.000001 -> 16 samples), without creating a tensor."""
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
        batch = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts,
                                        output_size=x.shape[0])
    _check_batch(batch, x.shape[0], "fps", "batch")
    if batch is None:
        n = x.shape[0]
        k = _samples(n, r, x.dtype)
        if k == 0:
            return torch.empty(0, dtype=torch.long, device=x.device)
        idx = _fps(_nograd(x).unsqueeze(0), k, None, random_start=bool(random_start))
        return idx[0]
    N = x.shape[0]
    if N == 0:
        return torch.empty(0, dtype=torch.long, device=x.device)
    if batch.dtype != torch.long:
        batch = batch.long()
    # One op computes on the device what the call needs (pcops::_fps_layout: the checks, the
    # largest cloud L, the number E of samples, ceil(n_b * ratio) rounded in the dtype of src
    # as torch_cluster does, and per point its cloud's first point and its place in the
    # [B, K] FPS output); its stats are the one synchronisation.
    stats, left, slot = torch.ops.pcops._fps_layout.default(
        batch, r, x.dtype, -1 if batch_size is None else max(int(batch_size), 0))
    problems, first, last, L, E, K = stats.tolist()
    if problems or first < 0:
        _check_batch_values(batch, "fps", "batch")  # raises the ValueError
    # After the synchronisation the GPU idles until the FPS is launched: launch it first, with
    # the least host work before it; the index arithmetic after it overlaps the kernel.
    if E == 0:
        return torch.empty(0, dtype=torch.long, device=x.device)
    B = min(_batch_size(batch_size, [last]), last + 1)  # trailing empty clouds sample nothing
    if B * L == N and B == last + 1:
        # every point lies in clouds 0..B-1, none larger than L, N = B * L points: all clouds
        # hold exactly L points. The flat points are the batch as they are (a view, no
        # lengths), and every cloud yields its K samples in order: the FPS's own output plus
        # each cloud's offset b * L, which is left[b * L] (a view: no arange).
        idx = _sample(_nograd(x).view(B, L, x.shape[1]), K, None, random_start)
        return idx.add_(left[::L].unsqueeze(1)).view(-1)
    padded, lengths, _ = _pack(_nograd(x), batch, B, L)
    idx = _sample(padded, K, lengths, random_start)
    points = torch.nonzero_static(slot >= 0, size=E).squeeze(1)  # E is known: no synchronisation
    return idx.view(-1)[slot[points]] + left[points]


def _sample(points: Tensor, K: int, lengths: Optional[Tensor], random_start) -> Tensor:
    """FPS of [B, L, D] -> idx [B, K]: the op itself unless the start is drawn at random."""
    if random_start:
        return _fps(points, K, lengths, random_start=True)
    return torch.ops.pcops.furthest_point_sample.default(points, K, lengths, None)[0]


def _edges(idx, n_x, count, y_first, x_first) -> Tensor:
    """edge_index [2, E] of the neighbour slots of idx [B, My, S] (pcops.neighbor_edges): rows
    are global y indices, columns global x indices (one cloud: m and idx as they are)."""
    return torch.ops.pcops.neighbor_edges.default(idx, n_x, count, y_first, x_first)


def _neighbours(op, x, y, batch_x, batch_y, batch_size, fn, *args):
    """Runs `op(query, ref, *args, query_lengths, ref_lengths)` on the clouds of y (queries)
    and x (refs). Returns (idx [B, My, S] local to each cloud, the op's second output, the
    global index of each cloud's first y and first x point ([B] each, or None for one cloud),
    the number of x points per cloud in idx): what pcops.neighbor_edges takes."""
    if batch_x is None and batch_y is None and (batch_size is None or int(batch_size) == 1):
        idx, second = op(y.unsqueeze(0), x.unsqueeze(0), *args)  # one cloud: no repacking
        return idx, second, None, None, x.shape[0]
    if batch_x is None:
        batch_x = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    if batch_y is None:
        batch_y = torch.zeros(y.shape[0], dtype=torch.long, device=y.device)
    lx, rx = _cloud_bounds(batch_x)
    ly, ry = _cloud_bounds(batch_y)
    last, (Lx, Ly) = _layout(fn, [("batch_x", batch_x), ("batch_y", batch_y)],
                             [(rx - lx).max(), (ry - ly).max()])
    B = _batch_size(batch_size, last)
    if B == 1:  # one cloud (sorted, non-negative ids whose largest is 0): no repacking
        idx, second = op(y.unsqueeze(0), x.unsqueeze(0), *args)
        return idx, second, None, None, x.shape[0]
    xp, x_len, x_ptr = _pack(x, batch_x, B, Lx)
    yp, y_len, y_ptr = _pack(y, batch_y, B, Ly)
    idx, second = op(yp, xp, *args, y_len, x_len)  # rows past y_len[b] hold no neighbour
    return idx, second, y_ptr[:-1], x_ptr[:-1], Lx


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
    # D < 3 is padded with zero coordinates (the same distances, cosine too); D > 3 and
    # cosine=True take pcops.knn's search of any dimension
    xs, ys = _points(x, "knn", "x"), _points(y, "knn", "y")
    extra = ("cosine",) if cosine else ()
    _check_batch(batch_x, xs.shape[0], "knn", "batch_x")
    _check_batch(batch_y, ys.shape[0], "knn", "batch_y")
    M = ys.shape[0]
    if M == 0 or xs.shape[0] == 0:
        return torch.empty((2, 0), dtype=torch.long, device=xs.device)

    def op(query, ref, k_, ql=None, rl=None):
        # no gradient flows from an edge list: the op below autograd (no Python autograd kernel)
        dist2, idx = _call(torch.ops.pcops.knn.default, (), _nograd(query), _nograd(ref), k_, ql, rl,
                           *extra)
        return idx, dist2

    idx, _, y_first, x_first, n_x = _neighbours(op, xs, ys, batch_x, batch_y, batch_size,
                                                "knn", k)
    if y_first is None and k <= xs.shape[0]:  # one cloud, every slot filled: no synchronisation
        rows = torch.arange(M, device=xs.device).unsqueeze(1).expand(M, k)
        return torch.stack([rows, idx.view(M, k)]).view(2, M * k)
    # the slots that hold a neighbour (idx >= 0), compacted by one op (its one synchronisation)
    return _edges(idx, n_x, None, y_first, x_first)


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
        return torch.ops.pcops.ball_query.default(_nograd(query), _nograd(ref), r_, s_, ql, rl)

    idx, count, y_first, x_first, n_x = _neighbours(op, xs, ys, batch_x, batch_y, batch_size,
                                                    "radius", float(r), S)
    if not ignore_same_index:
        # the first count[b, m] slots of each row, compacted by one op (its one synchronisation)
        return _edges(idx, n_x, count, y_first, x_first)
    # without x[i] for y[i], and at most max_num_neighbors of the others: those slots stay,
    # the rest become -1 (not an edge)
    rows = torch.arange(idx.shape[1], device=xs.device)
    rows = rows.unsqueeze(0) if y_first is None else rows + y_first.unsqueeze(1)  # global ids
    cols = idx if x_first is None else idx + x_first.view(-1, 1, 1)
    valid = torch.arange(S, device=xs.device) < count.unsqueeze(-1)
    valid &= cols != rows.unsqueeze(-1)
    valid &= valid.long().cumsum(2) <= max_num_neighbors
    return _edges(idx.masked_fill(~valid, -1), n_x, None, y_first, x_first)


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
