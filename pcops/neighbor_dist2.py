"""``neighbor_dist2``: the squared distance of each query to each of its listed neighbours,
with the fake (meta) implementation and autograd."""
import torch
from torch import Tensor

from ._dispatch import call as _call

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
    torch._check(query.dim() == 3 and query.shape[2] == 3, lambda: "query must be [B, M, 3]")
    torch._check(ref.dim() == 3 and ref.shape[2] == 3, lambda: "ref must be [B, N, 3]")
    torch._check(ref.dtype == query.dtype, lambda: "ref must have the dtype of query")
    torch._check(idx.dim() == 3 and idx.dtype in _INDEX_DTYPES,
                 lambda: "idx must be int64 or int32 [B, M, S]")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref and query differ in B")
    torch._check(idx.shape[0] == query.shape[0] and idx.shape[1] == query.shape[1],
                 lambda: "idx must be [B, M, S] with the B and M of query")
    return query.new_empty(idx.shape)


def _neighbor_dist2_setup_context(ctx, inputs, output):
    query, ref, idx = inputs
    if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
        ctx.save_for_backward(query, ref, idx)


def _neighbor_dist2_backward(ctx, grad):
    """t[b,m,s] = 2 grad[b,m,s] (q[b,m] - r[b,idx]) over the valid slots; d/dquery = sum over
    s of t, d/dref = the scatter-add of -t by idx (group_backward, a fixed order)."""
    need_query, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_query or need_ref):
        return None, None, None
    query, ref, idx = ctx.saved_tensors
    N = ref.shape[1]
    compute = torch.promote_types(query.dtype, torch.float32)
    valid = (idx >= 0) & (idx < N)
    idx = torch.where(valid, idx, -1)  # group / group_backward take [-1, N) only
    diff = query.to(compute).unsqueeze(2) - torch.ops.pcops.group.default(ref.to(compute), idx)
    t = (2 * grad.to(compute) * valid).unsqueeze(-1) * diff  # [B, M, S, 3]
    grad_query = t.sum(2).to(query.dtype) if need_query else None
    grad_ref = None
    if need_ref:
        grad_ref = torch.ops.pcops.group_backward.default(-t, idx, N).to(ref.dtype)
    return grad_query, grad_ref, None


torch.library.register_autograd(
    "pcops::neighbor_dist2", _neighbor_dist2_backward,
    setup_context=_neighbor_dist2_setup_context,
)
