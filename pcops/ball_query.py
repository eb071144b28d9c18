"""Ball query: wrappers, fake (meta) implementations, and the autograd of ball_query_dist2's
distances."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call as _call, call_plain as _call_plain, no_autograd as _no_autograd
from .neighbor_dist2 import _dist2_backward, _dist2_tangent

__all__ = ["ball_query", "ball_query_dist2"]


def ball_query(
    query: Tensor,
    ref: Tensor,
    radius: float,
    nsample: int,
    query_lengths: Optional[Tensor] = None,
    ref_lengths: Optional[Tensor] = None,
    *,
    return_count: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The first ``nsample`` reference points within ``radius`` of each query (PointNet++ ball
    query, Qi et al. 2017).

    For each query, the valid refs are scanned in index order and the first ``nsample`` with
    squared distance ``< radius**2`` are kept (not the nearest ones: use ``pcops.knn`` for
    that). Slots past the number found repeat the first neighbour, so ``pcops.group`` needs no
    mask; a query with no neighbour (or past ``query_lengths[b]``) gets -1 in every slot, never
    a valid-looking index 0. Points near the origin are neighbours like any other. CPU and CUDA
    return the same indices. Large 3-D clouds are searched through a uniform grid of the refs
    (same result as the brute force, bit for bit). Points of any other dimension D are
    searched by brute force, the squared distance summed over the coordinates in order, each
    product and sum rounded on its own (at D = 3 the same bits as the 3-D paths).

    Args:
        query: ``[B, M, D]`` centres (any D >= 1; D = 3 is the common case),
            float32/float64/float16/bfloat16 (half types compute in float32), on the CPU or
            CUDA; need not be contiguous.
        ref: ``[B, N, D]`` points, same D, dtype and device as ``query``.
        radius: finite and ``> 0``. The test is ``d < radius**2`` with ``radius**2`` computed
            in float64 and rounded once to the compute dtype. A squared distance that
            overflows between finite points is the compute dtype's largest finite value (as in
            :func:`pcops.knn`): outside any ball whose ``radius**2`` is finite in the compute
            dtype, inside when ``radius**2`` itself overflows to +inf (then every ref with
            finite coordinates is inside). Refs with a NaN or infinite coordinate never are.
        nsample: neighbours per query ``>= 1``.
        query_lengths: optional int64 ``[B]``: only the first ``query_lengths[b]`` queries of
            cloud ``b`` are valid (the others get -1 and count 0).
        ref_lengths: optional int64 ``[B]``: only the first ``ref_lengths[b]`` refs of cloud
            ``b`` are searched (ragged batches).
        return_count: also return the number of neighbours found.

    Returns:
        ``idx``: int64 ``[B, M, nsample]`` in ``[-1, N)``; with ``return_count=True`` the pair
        ``(idx, count)`` where ``count`` is int64 ``[B, M]``, the number found capped at
        ``nsample`` (``idx[b, m, :count]`` are the distinct neighbours).

    Example:
        >>> xyz = torch.rand(2, 1024, 3)
        >>> centres = xyz[:, :128]
        >>> idx, count = pcops.ball_query(centres, xyz, 0.2, 32, return_count=True)
        >>> grouped = pcops.group(xyz, idx) - centres[:, :, None]   # [2, 128, 32, 3]
    """
    idx, count = _call_plain(torch.ops.pcops.ball_query.default, query, ref, radius, nsample,
                             query_lengths, ref_lengths)
    return (idx, count) if return_count else idx


def ball_query_dist2(
    query: Tensor,
    ref: Tensor,
    radius: float,
    nsample: int,
    query_lengths: Optional[Tensor] = None,
    ref_lengths: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """:func:`ball_query` in PyTorch3D's layout, with the distances, in one op (outputs in
    :func:`knn`'s order).

    The same neighbours in the same slots as :func:`ball_query`, but slots past the number
    found hold -1 (``ball_query`` repeats the first neighbour there) and each slot's squared
    distance comes with it: 0 in empty slots, else the search's own arithmetic (the bits of
    ``pcops.neighbor_dist2(query, ref, idx)``). One dispatch, no host synchronisation.

    Args:
        query, ref, radius, nsample, query_lengths, ref_lengths: as for :func:`ball_query`.

    Returns:
        ``(dist2, idx)``: ``[B, M, nsample]`` in the dtype of ``query``, differentiable with
        respect to ``query`` and ``ref`` (as ``neighbor_dist2``: deterministic), and int64
        ``[B, M, nsample]`` in ``[-1, N)``.

    Example:
        >>> d2, idx = pcops.ball_query_dist2(centres, xyz, 0.2, 32)   # 0 / -1 past the hits
    """
    return _call(torch.ops.pcops.ball_query_dist2.default, (query, ref), query, ref, radius,
                 nsample, query_lengths, ref_lengths)


@torch.library.register_fake("pcops::ball_query_dist2")
def _ball_query_dist2_fake(query, ref, radius, nsample, query_lengths=None, ref_lengths=None):
    idx, _ = _ball_query_fake(query, ref, radius, nsample, query_lengths, ref_lengths,
                              op="ball_query_dist2")
    return query.new_empty(idx.shape), idx


class _BallQueryDist2(torch.autograd.Function):
    """ball_query_dist2's derivatives: dist2 with respect to query and ref, neighbor_dist2's
    formulas on the returned idx (-1 in the empty slots, whose dist2 is 0 and constant)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(query, ref, radius, nsample, query_lengths=None, ref_lengths=None):
        with _autograd._below_autograd():
            return torch.ops.pcops.ball_query_dist2.default(query, ref, radius, nsample,
                                                            query_lengths, ref_lengths)

    @staticmethod
    def setup_context(ctx, inputs, output):
        query, ref = inputs[0], inputs[1]
        ctx.mark_non_differentiable(output[1])
        _autograd.save(ctx, "ball_query_dist2", query=query, ref=ref, idx=output[1])

    @staticmethod
    def backward(ctx, grad_dist2, _grad_idx):
        need_query, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_dist2 is None or not (need_query or need_ref):
            return None, None, None, None, None, None
        query, ref, idx = ctx.saved_tensors
        grad_query, grad_ref = _dist2_backward(query, ref, idx, idx >= 0, grad_dist2,
                                               need_query, need_ref)
        return grad_query, grad_ref, None, None, None, None

    @staticmethod
    def jvp(ctx, dquery, dref, *_):
        query, ref, idx = ctx.saved_tensors
        return _dist2_tangent(query, ref, idx, idx >= 0, dquery, dref), None


_autograd.register("ball_query_dist2", _BallQueryDist2, defaults=(None, None))
_autograd.register_fold_vmap("ball_query_dist2", batched=(0, 1, 4, 5))


@torch.library.register_fake("pcops::ball_query")
def _ball_query_fake(query, ref, radius, nsample, query_lengths=None, ref_lengths=None, *,
                     op="ball_query"):
    _checks.check_devices(op, "query", query, ref=ref, query_lengths=query_lengths,
                          ref_lengths=ref_lengths)
    torch._check(query.dim() == 3 and query.shape[-1] >= 1,
                 lambda: "query must be [B, M, D] with D >= 1")
    torch._check(ref.dim() == 3 and ref.shape[-1] == query.shape[-1],
                 lambda: "ref must be [B, N, D] with the D of query")
    torch._check(ref.shape[0] == query.shape[0], lambda: "query and ref differ in B")
    torch._check(nsample >= 1, lambda: "nsample must be >= 1")
    B, M = query.shape[0], query.shape[1]
    return (
        query.new_empty((B, M, nsample), dtype=torch.long),
        query.new_empty((B, M), dtype=torch.long),
    )


@torch.library.register_fake("pcops::_ball_query_path")
def _ball_query_path_fake(query, ref, radius, nsample, query_lengths, ref_lengths, path):
    return _ball_query_fake(query, ref, radius, nsample, query_lengths, ref_lengths)


_autograd.register_fold_vmap("ball_query", batched=(0, 1, 4, 5))
_autograd.register_fold_vmap("_ball_query_path", batched=(0, 1, 4, 5))


# Autograd: ball_query's outputs are indices and counts, not differentiable: its Autograd key
# falls through (no autograd kernel on the call; inputs that require grad are accepted and the
# outputs do not require it). ball_query_dist2's distances have their formula in _autograd.py.
_no_autograd("ball_query", "_ball_query_path")
