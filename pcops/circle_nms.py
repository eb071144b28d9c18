"""Circle NMS: wrappers, fake (meta) implementations and autograd registrations."""
from typing import Optional

import torch
from torch import Tensor

from . import _autograd, _checks
from ._dispatch import call_plain as _call_plain, no_autograd as _no_autograd

__all__ = ["circle_nms", "circle_nms_mask"]


def circle_nms(
    centers: Tensor,
    scores: Tensor,
    radius: float,
    max_out: int = -1,
    groups: Optional[Tensor] = None,
) -> Tensor:
    """Greedy circle NMS (CenterPoint's centre-distance NMS); returns the kept indices.

    Visit the boxes by descending score (equal scores: lower index first, a stable sort); keep
    a box unless an already kept box of the same group lies within ``radius`` of it, i.e. at
    squared xy distance ``dx*dx + dy*dy < radius**2`` (z is ignored and the comparison is
    strict). The distance is computed in float32 (float64 for float64 centres) with
    ``radius**2`` rounded to that type; CPU and CUDA keep exactly the same boxes.

    NaN scores rank above every number (``torch.sort``'s rule), so those boxes are visited
    first: drop them beforehand (``scores.isnan()``) if that is not wanted. A centre with a NaN
    coordinate is within the radius of nothing: it is kept and removes nothing.

    Coming from CenterPoint / mmdetection3d (the numba ``circle_nms(dets, thresh)``): it
    compares the *squared* distance with ``thresh`` using ``<=``, so its ``thresh`` (the
    config's ``min_radius``) is a squared radius: pass ``radius=math.sqrt(thresh)``. The kept
    boxes agree except for pairs at exactly that distance (apart here, merged there) and for
    equal scores (its ``argsort()[::-1]`` visits ties in no fixed order). Its
    ``post_max_size`` is ``max_out`` here, and per-class NMS is one call with ``groups``.

    The number of kept boxes depends on the data, so on CUDA this waits once for the kernel's
    count, to size the output (it returns while the kernel finishes writing the indices: later
    work on the stream sees them). It cannot be captured in a CUDA graph (it raises there); in
    a graph, or where the code must not wait, use :func:`circle_nms_mask`. Under
    ``torch.compile`` the output has a data-dependent size.

    Args:
        centers: ``[N, 2]`` or ``[N, 3]`` box centres (for ``[N, 7]`` boxes pass
            ``boxes[:, :2]``), float32/float64/float16/bfloat16 (half types compute in
            float32), on the CPU or CUDA; need not be contiguous.
        scores: ``[N]`` floating-point scores, on the device of ``centers``.
        radius: the suppression radius, finite and ``> 0``, in the units of ``centers``.
        max_out: when ``> 0``, return at most this many indices (the first ones in visiting
            order: the highest scores); ``<= 0`` returns all.
        groups: optional int64 ``[N]`` (class or scene ids, any values): boxes of different
            groups never suppress each other. Without it all boxes form one group.

    Returns:
        int64 ``[K]``: the indices into ``centers`` of the kept boxes, in visiting order (by
        descending score).

    Memory: on CUDA, up to 4096 boxes take one launch of a thread block per 32 boxes, each
    testing its boxes against the earlier ones and deciding them (a workspace of about 4.4
    bytes per box); more boxes are sorted into a spatial grid in a workspace of about 250 bytes
    per box (the neighbour lists of the parallel rounds); at most 4194240 boxes. The CPU needs
    O(N).

    Example:
        >>> boxes = torch.rand(1000, 7) * 50            # x, y, z, l, w, h, yaw
        >>> scores, labels = torch.rand(1000), torch.randint(0, 3, (1000,))
        >>> keep = pcops.circle_nms(boxes[:, :2], scores, 2.0, max_out=83, groups=labels)
        >>> len(keep) <= 83
        True
    """
    return _call_plain(torch.ops.pcops.circle_nms.default, centers, scores, radius, max_out,
                       groups)


def circle_nms_mask(
    centers: Tensor,
    scores: Tensor,
    radius: float,
    groups: Optional[Tensor] = None,
) -> Tensor:
    """Greedy circle NMS as a mask over the boxes, with no host synchronisation.

    The same NMS as :func:`circle_nms` (descending score, ties to the lower index, squared xy
    distance ``< radius**2`` within a group, NaN scores first; see there, also for the mapping
    from CenterPoint's ``thresh``), returned as a mask in the original box order. Everything,
    the sort of the scores included, runs on the device, so the op can be captured in a CUDA
    graph and compiles with ``torch.compile(fullgraph=True)``. There is no ``max_out``: the
    True entries taken by descending score are :func:`circle_nms`'s output.

    Args:
        centers: ``[N, 2]`` or ``[N, 3]`` box centres, float32/float64/float16/bfloat16, on
            the CPU or CUDA; need not be contiguous.
        scores: ``[N]`` floating-point scores, on the device of ``centers``.
        radius: the suppression radius, finite and ``> 0``.
        groups: optional int64 ``[N]`` group ids: boxes of different groups never suppress
            each other.

    Returns:
        bool ``[N]``: True where the box is kept.

    Memory: as :func:`circle_nms` (on CUDA: about 4.4 bytes of workspace per box up to 4096
    boxes, else about 250 bytes per box).

    Example:
        >>> centers, scores = torch.rand(4096, 3) * 50, torch.rand(4096)
        >>> keep = pcops.circle_nms_mask(centers, scores, 1.0)          # [4096] bool
        >>> kept_scores = torch.where(keep, scores, 0.0)               # fixed shapes throughout
    """
    return _call_plain(torch.ops.pcops.circle_nms_mask.default, centers, scores, radius, groups)


def _check_fake_args(op, centers, scores, groups):
    _checks.check_devices(op, "centers", centers, scores=scores, groups=groups)
    torch._check(
        centers.dim() == 2 and centers.shape[1] in (2, 3),
        lambda: f"centers must be [N, 2] or [N, 3], got {tuple(centers.shape)}",
    )
    torch._check(
        scores.dim() == 1 and scores.shape[0] == centers.shape[0],
        lambda: f"scores must be [N], got {tuple(scores.shape)}",
    )
    if groups is not None:
        torch._check(
            groups.dim() == 1 and groups.shape[0] == centers.shape[0],
            lambda: f"groups must be [N], got {tuple(groups.shape)}",
        )


@torch.library.register_fake("pcops::circle_nms")
def _circle_nms_fake(centers, scores, radius, max_out=-1, groups=None):
    _check_fake_args("circle_nms", centers, scores, groups)
    K = torch.library.get_ctx().new_dynamic_size()
    return centers.new_empty((K,), dtype=torch.long)


@torch.library.register_fake("pcops::circle_nms_mask")
def _circle_nms_mask_fake(centers, scores, radius, groups=None):
    _check_fake_args("circle_nms_mask", centers, scores, groups)
    return centers.new_empty((centers.shape[0],), dtype=torch.bool)


@torch.library.register_fake("pcops::_circle_nms_path")
def _circle_nms_path_fake(centers, scores, radius, groups, path):
    _check_fake_args("_circle_nms_path", centers, scores, groups)
    n = centers.shape[0]
    return (centers.new_empty((n,), dtype=torch.bool), centers.new_empty((n,), dtype=torch.long),
            centers.new_empty((1,), dtype=torch.long))


# Autograd: the outputs are int64 / bool indices and masks, nothing to differentiate. The
# Autograd key falls through, so inputs that require grad are accepted and the call stays in C++
# (a Python autograd kernel cost several microseconds per call).
_no_autograd("circle_nms", "circle_nms_mask", "_circle_nms_path")


# vmap: circle_nms's output size depends on each sample's data, so it cannot be batched;
# circle_nms_mask's can: one call per sample (the boxes of a sample are one problem).
_autograd.register_no_vmap(
    "circle_nms", "the number of kept boxes differs between samples; use pcops.circle_nms_mask "
    "(a mask of fixed size) under vmap, or one call with `groups` holding the sample ids")


@torch.library.register_vmap("pcops::circle_nms_mask", lib=_autograd._LIB)
def _circle_nms_mask_vmap(info, in_dims, centers, scores, radius, groups=None):
    def sample(t, dim, i):
        return t if dim is None else t.select(dim, i)

    dims = tuple(in_dims) + (None,) * (4 - len(in_dims))
    masks = [torch.ops.pcops.circle_nms_mask.default(
        sample(centers, dims[0], i), sample(scores, dims[1], i), radius,
        None if groups is None else sample(groups, dims[3], i)) for i in range(info.batch_size)]
    return torch.stack(masks), 0
