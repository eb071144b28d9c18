"""Furthest point sampling: wrapper, fake (meta) implementation and autograd registration."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call_plain as _call_plain, no_autograd as _no_autograd

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
    sample exactly as they do near it. A squared distance that overflows between finite points
    is the compute dtype's largest finite value (as in :func:`pcops.knn`; a float16 / bfloat16
    ``dist2`` is capped at its type's largest finite value), so the coverage curve stays finite
    and points at the maximum tie, to the lower index. Points of any dimension D are sampled
    (PyTorch3D's ``sample_farthest_points`` takes any D): the squared distance is summed over
    the coordinates in order, each product and sum rounded on its own, so D = 3 has the same
    bits on its own fast paths; other D take the simple path (every step scans the cloud).

    Args:
        xyz: ``[B, N, D]`` points (any D >= 1; D = 3 is the common case),
            float32/float64/float16/bfloat16 (half types compute in float32), on the CPU or
            CUDA; need not be contiguous.
        npoint: number of samples ``>= 1``.
        lengths: optional int64 ``[B]``: cloud ``b`` is its first ``lengths[b]`` points (ragged
            batches). Slots past ``min(npoint, lengths[b])`` hold -1.
        start: optional int64 ``[B]``: the first sample of each cloud, in ``[0, lengths[b])``
            (checked exactly on the CPU; on CUDA, where a check would synchronise with the host,
            only under :func:`pcops.set_debug_checks`, and otherwise a value outside is taken
            modulo ``lengths[b]``).
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
    if random_start:
        start = _resolve_start(xyz, lengths, start, random_start)
    idx, dist2 = _call_plain(torch.ops.pcops.furthest_point_sample.default, xyz, npoint, lengths,
                             start)
    return (idx, dist2) if return_dist2 else idx


def _resolve_start(xyz: Tensor, lengths: Optional[Tensor], start: Optional[Tensor],
                   random_start: bool) -> Optional[Tensor]:
    """The start tensor to pass to the op: the user's (the op checks its values exactly on the
    CPU), or for random_start one drawn uniformly in [0, lengths[b]) on xyz's device from torch's
    default generator, with no host synchronisation: a draw in [0, 2**62) taken modulo the
    length (the bias, below 2**-30, is far from measurable)."""
    if not random_start:
        return start
    if start is not None:
        raise ValueError("pcops.furthest_point_sample: pass either 'start' or random_start=True, not both")
    if not (isinstance(xyz, Tensor) and xyz.dim() == 3):
        return None  # the op reports the bad xyz
    B, N = xyz.shape[0], xyz.shape[1]
    draw = torch.randint(0, 1 << 62, (B,), device=xyz.device, dtype=torch.long)
    if isinstance(lengths, Tensor) and lengths.shape == (B,) and lengths.device == xyz.device:
        return draw.remainder_(lengths.clamp(1, max(N, 1)))  # an empty cloud ignores its start
    return draw.remainder_(max(N, 1))


def _fps_fake(xyz, npoint, lengths=None, start=None, path=0):
    _checks.check_devices("furthest_point_sample", "xyz", xyz, lengths=lengths, start=start)
    torch._check(xyz.dim() == 3 and xyz.shape[-1] >= 1, lambda: "xyz must be [B, N, D], D >= 1")
    torch._check(npoint >= 1, lambda: "npoint must be >= 1")
    B = xyz.shape[0]
    return xyz.new_empty((B, npoint), dtype=torch.long), xyz.new_empty((B, npoint))


torch.library.register_fake("pcops::furthest_point_sample")(_fps_fake)
torch.library.register_fake("pcops::_furthest_point_sample_path")(_fps_fake)
_autograd.register_fold_vmap("furthest_point_sample", batched=(0, 2, 3))
_autograd.register_fold_vmap("_furthest_point_sample_path", batched=(0, 2, 3))


# Autograd: none. The outputs (indices, coverage curve) are not differentiable; the Autograd key
# falls through, so a call never enters Python after this wrapper and the outputs never require
# grad.
_no_autograd("furthest_point_sample", "_furthest_point_sample_path")


@torch.library.register_fake("pcops::_fps_layout")
def _fps_layout_fake(batch, ratio, dtype, batch_size=-1):
    torch._check(batch.dim() == 1 and batch.dtype == torch.long, lambda: "batch must be int64 [N]")
    torch._check(0 < ratio <= 1, lambda: "ratio must be in (0, 1]")
    torch._check(batch_size >= -1, lambda: "batch_size must be >= -1")
    return batch.new_empty(6), batch.new_empty(batch.shape[0]), batch.new_empty(batch.shape[0])
