"""``neighbor_edges``: neighbour lists (a kNN's or ball query's idx) as COO edges
``[2, E]``, with the fake (meta) implementation."""
from typing import Optional

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call_plain as _call_plain

__all__ = ["neighbor_edges"]


def neighbor_edges(idx: Tensor, num_ref: int, count: Optional[Tensor] = None,
                   row_offset: Optional[Tensor] = None,
                   col_offset: Optional[Tensor] = None) -> Tensor:
    """The neighbours of ``idx`` as a COO edge list (torch_cluster's / PyG's ``edge_index``).

    One edge per slot ``(b, m, s)`` with ``0 <= idx[b, m, s] < num_ref`` (so -1 slots are not
    edges) and, when ``count`` is given, ``s < count[b, m]`` (a ball query's padding, which
    repeats the first neighbour, is not an edge either); edges in ``(b, m, s)`` order (for a
    kNN: each query's neighbours nearest first). ``edges[0] = row_offset[b] + m`` and
    ``edges[1] = col_offset[b] + idx[b, m, s]``; without offsets the flat indices
    ``b * M + m`` and ``b * num_ref + idx`` (for one cloud: ``m`` and ``idx``).

    The number of edges depends on the data: on CUDA the op reads it back (one host
    synchronisation, like ``torch.nonzero``), so it cannot be captured in a CUDA graph.

    Args:
        idx: int64 ``[B, M, S]``, e.g. :func:`pcops.knn`'s or :func:`pcops.ball_query`'s.
        num_ref: N, the number of reference points per cloud (``idx`` values index them).
        count: optional int64 ``[B, M]``: only the first ``count[b, m]`` slots of a row count
            (:func:`pcops.ball_query`'s ``count``).
        row_offset, col_offset: optional int64 ``[B]``, added to ``m`` and to ``idx``.

    Returns:
        int64 ``[2, E]`` (contiguous).

    Example:
        >>> idx, count = pcops.ball_query(y[None], x[None], 0.2, 32, return_count=True)
        >>> edge_index = pcops.neighbor_edges(idx, x.shape[0], count)   # [2, E]
    """
    return _call_plain(torch.ops.pcops.neighbor_edges.default, idx, num_ref, count, row_offset,
                       col_offset)


@torch.library.register_fake("pcops::neighbor_edges")
def _neighbor_edges_fake(idx, num_ref, count=None, row_offset=None, col_offset=None):
    _checks.check_devices("neighbor_edges", "idx", idx, count=count, row_offset=row_offset,
                          col_offset=col_offset)
    torch._check(idx.dim() == 3 and idx.dtype == torch.long, lambda: "idx must be int64 [B, M, S]")
    torch._check(num_ref >= 0, lambda: "num_ref must be >= 0")
    if count is not None:
        torch._check(count.shape == idx.shape[:2], lambda: "count must be [B, M]")
    for t in (row_offset, col_offset):
        if t is not None:
            torch._check(t.dim() == 1 and t.shape[0] == idx.shape[0], lambda: "offsets must be [B]")
    E = torch.library.get_ctx().new_dynamic_size()
    return idx.new_empty((2, E))


_autograd.register_no_vmap(
    "neighbor_edges", "the number of edges differs between samples; fold the vmapped "
    "dimension into the batch dimension B instead (flat indices b * M + m, b * num_ref + idx)")
