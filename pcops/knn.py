"""k nearest neighbours: wrapper, fake (meta) implementation and autograd registration."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call as _call, no_autograd as _no_autograd
from .group import _group, _group_backward
from .neighbor_dist2 import _dist2_backward, _dist2_tangent

__all__ = ["knn"]


def knn(
    query: Tensor,
    ref: Tensor,
    k: int,
    query_lengths: Optional[Tensor] = None,
    ref_lengths: Optional[Tensor] = None,
    metric: str = "l2",
) -> Tuple[Tensor, Tensor]:
    """The ``k`` nearest reference points of each query point, by squared distance (or by the
    L1 or cosine distance, ``metric``), for points of any dimension D.

    For each valid query the ``k`` nearest valid refs, sorted by (squared distance, index)
    ascending: ties go to the lower index, and the CPU and CUDA return the same indices. There
    is no cap on ``k``: slots past the number of valid refs hold index -1 and distance +inf.
    Squared distances are computed as ``dx*dx + dy*dy + dz*dz`` in the input's precision
    (float32 for half types), with no FMA contraction. +inf means an empty slot only: where the
    squared distance of two points with finite coordinates overflows, it is the largest finite
    value of the compute dtype (and a float16 / bfloat16 ``dist2`` too large for its type is
    that type's largest finite value), so with finite coordinates and ``k`` <= valid refs every
    slot holds a neighbour; refs at the maximum tie and come in index order. A ref with a NaN or
    infinite coordinate is never a neighbour. For D coordinates the sum runs over them in
    order, each product and sum rounded on its own (for D = 3 the same bits); the L1 and cosine
    metrics follow the same rule.

    Large 3-D clouds are searched through a uniform grid of the refs (CPU and CUDA), small ones
    by brute force; both return the same bits. Points of D != 3 coordinates, and the metrics
    other than ``"l2"``, are searched by brute force. On CUDA no path synchronises with the host (the
    grid's box and cell sizes are computed on the device), so calls can be captured in a CUDA
    graph with fixed shapes.

    Args:
        query: ``[B, M, D]`` query points (any D >= 1), float32/float64/float16/bfloat16, on
            the CPU or CUDA; need not be contiguous. A ``[M, D]`` tensor (with a ``[N, D]``
            ``ref`` and no lengths) is one cloud: the results then have no batch dimension.
        ref: ``[B, N, D]`` reference points, same D, dtype and device as ``query``.
        k: number of neighbours ``>= 1``; may exceed ``N``.
        query_lengths: optional int64 ``[B]`` in ``[0, M]``: only the first
            ``query_lengths[b]`` queries of cloud ``b`` are valid; the rows of the others are
            all -1 / +inf.
        ref_lengths: optional int64 ``[B]`` in ``[0, N]``: only the first ``ref_lengths[b]``
            refs of cloud ``b`` are candidates (ragged batches).
        metric: ``"l2"`` (squared Euclidean, the default), ``"l1"`` (sum of absolute
            differences, PyTorch3D's ``norm=1``) or ``"cosine"`` (``1 - a.b / (|a| |b|)``,
            clamped at 0, and 1 where either point is zero; torch_cluster's ``cosine=True``).
            ``dist2`` then holds that distance.

    Returns:
        ``(dist2, idx)``: ``dist2`` ``[B, M, k]`` in ``query``'s dtype, differentiable with
        respect to ``query`` and ``ref`` (the backward is deterministic); ``idx`` ``[B, M, k]``
        int64 in ``[-1, N)``.

    Example:
        >>> xyz = torch.rand(2, 1024, 3)
        >>> centres = xyz[:, :256]
        >>> dist2, idx = pcops.knn(centres, xyz, 16)              # [2, 256, 16] each
        >>> neighbours = pcops.group(xyz, idx)                     # [2, 256, 16, 3]
    """
    if query.dim() == 2 and ref.dim() == 2 and query_lengths is None and ref_lengths is None:
        if metric == "l2":  # the schema's default: left out, as the dispatcher would
            dist2, idx = _call(torch.ops.pcops.knn.default, (query, ref), query.unsqueeze(0),
                               ref.unsqueeze(0), k)
        else:
            dist2, idx = _call(torch.ops.pcops.knn.default, (query, ref), query.unsqueeze(0),
                               ref.unsqueeze(0), k, None, None, metric)
        return dist2.squeeze(0), idx.squeeze(0)
    if metric == "l2":
        return _call(torch.ops.pcops.knn.default, (query, ref), query, ref, k, query_lengths,
                     ref_lengths)
    return _call(torch.ops.pcops.knn.default, (query, ref), query, ref, k, query_lengths,
                 ref_lengths, metric)


_METRICS = ("l2", "l1", "cosine")


@torch.library.register_fake("pcops::knn")
def _knn_fake(query, ref, k, query_lengths=None, ref_lengths=None, metric="l2"):
    _checks.check_devices("knn", "query", query, ref=ref, query_lengths=query_lengths,
                          ref_lengths=ref_lengths)
    torch._check(query.dim() == 3 and query.shape[-1] >= 1,
                 lambda: "query must be [B, M, D] with D >= 1")
    torch._check(ref.dim() == 3 and ref.shape[-1] == query.shape[-1],
                 lambda: "ref must be [B, N, D] with the D of query")
    torch._check(metric in _METRICS, lambda: "metric must be 'l2', 'l1' or 'cosine'")
    torch._check(ref.shape[0] == query.shape[0], lambda: "query and ref must have one batch size")
    torch._check(ref.dtype == query.dtype, lambda: "query and ref must have one dtype")
    torch._check(k >= 1, lambda: "k must be >= 1")
    B, M = query.shape[0], query.shape[1]
    return query.new_empty((B, M, k)), query.new_empty((B, M, k), dtype=torch.long)


class _Knn(torch.autograd.Function):
    """knn's derivatives (see pcops/_autograd.py): dist2 with respect to query and ref, in
    reverse and forward mode; idx is not differentiable."""

    generate_vmap_rule = True

    @staticmethod
    def forward(query, ref, k, query_lengths=None, ref_lengths=None, metric="l2"):
        with _autograd._below_autograd():
            return torch.ops.pcops.knn.default(query, ref, k, query_lengths, ref_lengths, metric)

    @staticmethod
    def setup_context(ctx, inputs, output):
        query, ref = inputs[0], inputs[1]
        ctx.metric = inputs[5] if len(inputs) > 5 else "l2"
        ctx.mark_non_differentiable(output[1])
        _autograd.save(ctx, "knn", query=query, ref=ref, idx=output[1])

    @staticmethod
    def backward(ctx, grad_dist2, _grad_idx):
        """d dist2[b,m,j] / d query[b,m] = 2 (q - r_idx), and -2 (q - r_idx) for ref[b,idx]:
        the ref gradient is scattered by group_backward, in a fixed order (deterministic).
        Empty slots (idx -1, dist2 +inf) contribute nothing."""
        need_query, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_dist2 is None or not (need_query or need_ref):
            return None, None, None, None, None, None
        query, ref, idx = ctx.saved_tensors
        if ctx.metric == "l2":
            grad_query, grad_ref = _dist2_backward(query, ref, idx, idx >= 0, grad_dist2,
                                                   need_query, need_ref)
        else:
            grad_query, grad_ref = _metric_backward(ctx.metric, query, ref, idx, grad_dist2,
                                                    need_query, need_ref)
        return grad_query, grad_ref, None, None, None, None

    @staticmethod
    def jvp(ctx, dquery, dref, _dk, _dql, _drl, _dmetric):
        """The tangent of dist2: 2 <q - r_idx, dq - dr_idx> in the valid slots, 0 in the empty
        ones (the backward's products); for L1 / cosine <d dist / dq, dq> + <d dist / dr,
        dr_idx>."""
        query, ref, idx = ctx.saved_tensors
        if ctx.metric == "l2":
            return _dist2_tangent(query, ref, idx, idx >= 0, dquery, dref), None
        return _metric_tangent(ctx.metric, query, ref, idx, dquery, dref), None


def _metric_partials(metric: str, query: Tensor, ref: Tensor, idx: Tensor):
    """(d dist / d q, d dist / d r_idx), each [B, M, k, D] in the compute dtype, 0 in the empty
    slots, for metric "l1" (sign(q - r), its negation; 0 where they are equal) or "cosine"
    (with c = q.r / (|q| |r|): -(r / (|q| |r|) - c q / |q|^2) and the same with q and r
    swapped; 0 where either norm is 0 or the distance is clamped at 0, where it is constant)."""
    work = _autograd.compute_dtype(query.dtype)
    valid = (idx >= 0).unsqueeze(-1)
    q = query.to(work).unsqueeze(2)
    r = _group(ref.to(work), idx)
    if metric == "l1":
        gq = torch.sign(q - r)
        gq = torch.where(valid, gq, 0.0)
        return gq, -gq
    nq2 = (q * q).sum(-1, keepdim=True)
    nr2 = (r * r).sum(-1, keepdim=True)
    live = valid & (nq2 > 0) & (nr2 > 0)
    nq2s = torch.where(live, nq2, 1.0)
    nr2s = torch.where(live, nr2, 1.0)
    inv = torch.rsqrt(nq2s * nr2s)
    c = (q * r).sum(-1, keepdim=True) * inv
    live = live & (c < 1)
    gq = -(r * inv - c * q / nq2s)
    gr = -(q * inv - c * r / nr2s)
    return torch.where(live, gq, 0.0), torch.where(live, gr, 0.0)


def _metric_backward(metric, query, ref, idx, grad, need_query, need_ref):
    """(grad_query, grad_ref) of the L1 / cosine distances, as _dist2_backward: the query's
    slots summed, the refs' scattered by group_backward (a fixed order: deterministic)."""
    gq, gr = _metric_partials(metric, query, ref, idx)
    g = torch.where(idx >= 0, grad.to(gq.dtype), 0.0).unsqueeze(-1)
    grad_query = (gq * g).sum(2).to(query.dtype) if need_query else None
    grad_ref = (_group_backward(gr * g, idx, ref.shape[1]).to(ref.dtype) if need_ref
                else None)
    return grad_query, grad_ref


def _metric_tangent(metric, query, ref, idx, dquery, dref):
    gq, gr = _metric_partials(metric, query, ref, idx)
    t = torch.zeros(idx.shape, dtype=gq.dtype, device=gq.device)
    if dquery is not None:
        t = t + (gq * dquery.to(gq.dtype).unsqueeze(2)).sum(-1)
    if dref is not None:
        t = t + (gr * _group(dref.to(gq.dtype), idx)).sum(-1)
    return t.to(query.dtype)


_autograd.register("knn", _Knn, defaults=(None, None, "l2"))
_autograd.register_fold_vmap("knn", batched=(0, 1, 3, 4))
_autograd.register_fold_vmap("_knn_path", batched=(0, 1, 3, 4))


@torch.library.register_fake("pcops::_knn_path")
def _knn_path_fake(query, ref, k, query_lengths, ref_lengths, path):
    return _knn_fake(query, ref, k, query_lengths, ref_lengths)


# The private _knn_path is for comparing paths' results: not differentiable (knn's formula is
# in _autograd.py), so its Autograd key falls through.
_no_autograd("_knn_path")
