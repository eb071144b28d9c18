"""Furthest point sampling: wrapper, fake (meta) implementation and autograd registration."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = ["furthest_point_sample"]


def furthest_point_sample(
    xyz: Tensor,
    npoint: int,
    lengths: Optional[Tensor] = None,
    start: Optional[Tensor] = None,
    *,
    random_start: bool = False,
    return_dist2: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Greedy farthest point sampling (PointNet++, Qi et al. 2017).

    Sample 0 is ``start[b]`` (default 0); each next sample is the valid point farthest from the
    samples chosen so far (ties go to the lower index). A chosen point is never chosen again, so
    the indices of a row are unique whenever ``npoint <= lengths[b]``, also for clouds with
    duplicate points. Distances start at +inf, so clouds far from the origin (UTM coordinates)
    sample exactly as they do near it.

    Args:
        xyz: ``[B, N, 3]`` points, float32/float64/float16/bfloat16 (half types compute in
            float32), on the CPU or CUDA; need not be contiguous.
        npoint: number of samples ``>= 1``.
        lengths: optional int64 ``[B]``: cloud ``b`` is its first ``lengths[b]`` points (ragged
            batches). Slots past ``min(npoint, lengths[b])`` hold -1.
        start: optional int64 ``[B]``: the first sample of each cloud, in ``[0, lengths[b])``.
        random_start: draw the first samples uniformly on the device from torch's default
            generator (``torch.manual_seed`` makes it reproducible), with no host
            synchronisation. Excludes ``start``.
        return_dist2: also return the coverage curve.

    Returns:
        ``idx``: int64 ``[B, npoint]``; with ``return_dist2=True`` the pair ``(idx, dist2)``
        where ``dist2[b, j]`` (xyz's dtype) is the squared distance from sample ``j`` to the
        nearest earlier sample when it was chosen: the squared coverage radius of the first
        ``j`` samples (0 for sample 0 and for empty slots). It does not increase along a row.

    Example:
        >>> xyz = torch.rand(2, 1024, 3)
        >>> idx = pcops.furthest_point_sample(xyz, 256)           # [2, 256]
        >>> centres = xyz.gather(1, idx[..., None].expand(-1, -1, 3))
    """
    idx, dist2 = torch.ops.pcops.furthest_point_sample.default(
        xyz, npoint, lengths, start, random_start
    )
    return (idx, dist2) if return_dist2 else idx


@torch.library.register_fake("pcops::furthest_point_sample")
def _fps_fake(xyz, npoint, lengths=None, start=None, random_start=False):
    torch._check(xyz.dim() == 3 and xyz.shape[-1] == 3, lambda: "xyz must be [B, N, 3]")
    torch._check(npoint >= 1, lambda: "npoint must be >= 1")
    B = xyz.shape[0]
    return xyz.new_empty((B, npoint), dtype=torch.long), xyz.new_empty((B, npoint))


def _fps_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _fps_backward(ctx, grad_idx, grad_dist2):
    return None, None, None, None, None


torch.library.register_autograd(
    "pcops::furthest_point_sample", _fps_backward, setup_context=_fps_setup_context
)
