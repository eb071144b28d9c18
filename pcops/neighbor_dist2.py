"""``neighbor_dist2``: the squared distance of each query to each of its listed neighbours,
with the fake (meta) implementation and autograd."""
from typing import Optional

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call as _call
from .group import _group, _group_backward

__all__ = ["neighbor_dist2"]

# idx: int64, or int32 (read as is, without a converted copy)
_INDEX_DTYPES = (torch.long, torch.int32)


def neighbor_dist2(query: Tensor, ref: Tensor, idx: Tensor) -> Tensor:
    """Squared distances to listed neighbours:
    ``dist2[b, m, s] = |query[b, m] - ref[b, idx[b, m, s]]|**2``, 0 where ``idx`` lies outside
    ``[0, N)`` (-1: an empty slot).

    The distances :func:`pcops.ball_query` does not return (it returns indices only): pass its
    ``idx``, or any neighbour list. The arithmetic is the searches' own (``dx*dx + dy*dy +
    dz*dz`` left to right, no FMA contraction), so the neighbours of :func:`pcops.knn` get
    ``knn``'s ``dist2`` bit for bit, and CPU and CUDA give the same bits. One kernel, no host
    synchronisation; any index value is allowed (nothing to check), so it is also CUDA-graph
    capturable.

    Differentiable with respect to ``query`` and ``ref`` (``d/dq = 2 (q - r)``, the ``ref``
    gradient scattered by :func:`pcops.group_backward`: deterministic, no atomics).

    Args:
        query: ``[B, M, 3]`` float32/float64/float16/bfloat16 (half types compute in float32).
        ref: ``[B, N, 3]``, the dtype and device of ``query``.
        idx: int64 or int32 ``[B, M, S]``, indices into ``ref`` (int32 is read as is).

    Returns:
        ``[B, M, S]`` in the dtype of ``query``.

    Example:
        >>> idx = pcops.ball_query(centres, xyz, 0.2, 32)            # [B, M, 32]
        >>> d2 = pcops.neighbor_dist2(centres, xyz, idx)              # [B, M, 32], < 0.04
    """
    return _call(torch.ops.pcops.neighbor_dist2.default, (query, ref), query, ref, idx)


@torch.library.register_fake("pcops::neighbor_dist2")
def _neighbor_dist2_fake(query, ref, idx):
    _checks.check_devices("neighbor_dist2", "query", query, ref=ref, idx=idx)
    torch._check(query.dim() == 3 and query.shape[2] == 3, lambda: "query must be [B, M, 3]")
    torch._check(ref.dim() == 3 and ref.shape[2] == 3, lambda: "ref must be [B, N, 3]")
    torch._check(ref.dtype == query.dtype, lambda: "ref must have the dtype of query")
    torch._check(idx.dim() == 3 and idx.dtype in _INDEX_DTYPES,
                 lambda: "idx must be int64 or int32 [B, M, S]")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref and query differ in B")
    torch._check(idx.shape[0] == query.shape[0] and idx.shape[1] == query.shape[1],
                 lambda: "idx must be [B, M, S] with the B and M of query")
    return query.new_empty(idx.shape)


# ---- derivatives of squared distances to gathered neighbours (neighbor_dist2, knn,
# ball_query_dist2): d |q - r_idx|**2 = 2 <q - r_idx, dq - dr_idx> in the valid slots


def _dist2_backward(query: Tensor, ref: Tensor, idx: Tensor, valid: Tensor, grad: Tensor,
                    need_query: bool, need_ref: bool):
    """(grad_query, grad_ref) of dist2[b,m,s] = |query[b,m] - ref[b, idx[b,m,s]]|**2 over the
    ``valid`` slots (``idx`` in [-1, N), -1 where not valid). t = 2 grad (q - r_idx) in float32
    for half types; d/dquery is the sum of t over s, d/dref the scatter-add of -t by
    group_backward (a fixed order: deterministic)."""
    work = _autograd.compute_dtype(query.dtype)
    diff = query.to(work).unsqueeze(2) - _group(ref.to(work), idx)  # [B, M, S, 3]
    g = torch.where(valid, grad.to(work), 0.0).unsqueeze(-1)
    t = torch.where(valid.unsqueeze(-1), 2.0 * diff * g, 0.0)
    grad_query = t.sum(2).to(query.dtype) if need_query else None
    grad_ref = _group_backward(-t, idx, ref.shape[1]).to(ref.dtype) if need_ref else None
    return grad_query, grad_ref


def _dist2_tangent(query: Tensor, ref: Tensor, idx: Tensor, valid: Tensor,
                   dquery: Optional[Tensor], dref: Optional[Tensor]) -> Tensor:
    """The tangent of the same dist2 for tangents ``dquery`` / ``dref`` (either may be None):
    sum over the coordinates of 2 (q - r_idx) (dq - dr_idx), the backward's products, 0
    outside the valid slots; in the dtype of ``query``."""
    work = _autograd.compute_dtype(query.dtype)
    diff = query.to(work).unsqueeze(2) - _group(ref.to(work), idx)
    d = dquery.to(work).unsqueeze(2) if dquery is not None else None
    if dref is not None:
        gathered = _group(dref.to(work), idx)
        d = -gathered if d is None else d - gathered
    t = (2.0 * diff * d).sum(-1)
    return torch.where(valid, t, 0.0).to(query.dtype)


class _NeighborDist2(torch.autograd.Function):
    """neighbor_dist2's derivatives with respect to query and ref (see pcops/_autograd.py)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(query, ref, idx):
        with _autograd._below_autograd():
            return torch.ops.pcops.neighbor_dist2.default(query, ref, idx)

    @staticmethod
    def setup_context(ctx, inputs, output):
        query, ref, idx = inputs
        _autograd.save(ctx, "neighbor_dist2", query=query, ref=ref, idx=idx)

    @staticmethod
    def backward(ctx, grad):
        need_query, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_query or need_ref):
            return None, None, None
        query, ref, idx = ctx.saved_tensors
        valid, idx = _valid_slots(idx, ref.shape[1])
        return (*_dist2_backward(query, ref, idx, valid, grad, need_query, need_ref), None)

    @staticmethod
    def jvp(ctx, dquery, dref, _didx):
        query, ref, idx = ctx.saved_tensors
        valid, idx = _valid_slots(idx, ref.shape[1])
        return _dist2_tangent(query, ref, idx, valid, dquery, dref)


def _valid_slots(idx: Tensor, N: int):
    """(valid, idx with -1 outside [0, N)): neighbor_dist2 takes any index value, group and
    group_backward take [-1, N) only."""
    valid = (idx >= 0) & (idx < N)
    return valid, torch.where(valid, idx, -1)


_autograd.register("neighbor_dist2", _NeighborDist2)
_autograd.register_fold_vmap("neighbor_dist2", batched=(0, 1, 2))
