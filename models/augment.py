"""Batched augmentations: small functions on a batch xyz[B,N,3] -> xyz[B,N,3] that run on the
batch's device and draw from an explicit torch.Generator, so a GPU batch is augmented on the GPU
with no host sync; Augment chains them as the training command configures them.
"""
import math

import torch
from torch import Tensor

__all__ = ["random_subset", "random_scale", "random_shift", "jitter", "rotate_up", "point_dropout", "Augment"]


def _rand(shape, ref: Tensor, generator) -> Tensor:
    return torch.rand(shape, device=ref.device, dtype=ref.dtype, generator=generator)


def random_subset(xyz: Tensor, n: int, generator=None) -> Tensor:
    """n of the P points of each cloud, distinct and in random order: [B,P,3] -> [B,n,3]. The
    random order also randomises the FPS start point (sample 0 is the first point)."""
    B, P, _ = xyz.shape
    if n > P:
        raise ValueError(f"cannot take {n} points from clouds of {P}")
    order = torch.rand(B, P, device=xyz.device, generator=generator).argsort(dim=1)[:, :n]
    return xyz.gather(1, order.unsqueeze(-1).expand(B, n, 3))


def random_scale(xyz: Tensor, low: float = 0.8, high: float = 1.25, anisotropic: bool = True,
                 generator=None) -> Tensor:
    """Scale each cloud by a factor uniform in [low, high] (one per axis if anisotropic)."""
    k = 3 if anisotropic else 1
    return xyz * (low + (high - low) * _rand((xyz.shape[0], 1, k), xyz, generator))


def random_shift(xyz: Tensor, amount: float = 0.1, generator=None) -> Tensor:
    """Translate each cloud by a vector uniform in [-amount, amount]^3."""
    return xyz + amount * (2 * _rand((xyz.shape[0], 1, 3), xyz, generator) - 1)


def jitter(xyz: Tensor, sigma: float = 0.01, clip: float = 0.05, generator=None) -> Tensor:
    """Add Gaussian noise of standard deviation sigma, clipped to [-clip, clip], to every point."""
    noise = torch.randn(xyz.shape, device=xyz.device, dtype=xyz.dtype, generator=generator)
    return xyz + (sigma * noise).clamp_(-clip, clip)


def rotate_up(xyz: Tensor, up_axis: int = 1, generator=None) -> Tensor:
    """Rotate each cloud by an angle uniform in [0, 2 pi) about the up axis (1 = y, as in
    ModelNet40's npz, HDF5 and normal_resampled files; 2 = z)."""
    angle = 2 * math.pi * _rand((xyz.shape[0],), xyz, generator)
    c, s = angle.cos(), angle.sin()
    a, b = [i for i in range(3) if i != up_axis]  # the rotation acts in the (a, b) plane
    out = xyz.clone()
    out[..., a] = c[:, None] * xyz[..., a] - s[:, None] * xyz[..., b]
    out[..., b] = s[:, None] * xyz[..., a] + c[:, None] * xyz[..., b]
    return out


def point_dropout(xyz: Tensor, max_ratio: float = 0.875, generator=None) -> Tensor:
    """Drop a fraction uniform in [0, max_ratio] of each cloud's points, replacing them by the
    cloud's first point, so the shape of the batch stays [B,N,3] (PointNet++'s recipe)."""
    B, N, _ = xyz.shape
    ratio = max_ratio * _rand((B, 1), xyz, generator)
    drop = _rand((B, N), xyz, generator) < ratio
    drop[:, 0] = False
    return torch.where(drop.unsqueeze(-1), xyz[:, :1], xyz)


class Augment:
    """The training augmentation, applied to a batch in this order: random scale, shift,
    rotation about the up axis, jitter, point dropout. A zero/None/False setting skips a step.

    Args:
        scale: (low, high) of random_scale, or None.
        anisotropic: one scale factor per axis.
        shift: amount of random_shift.
        rotate: rotate about the up axis.
        up_axis: 1 (y) or 2 (z).
        jitter: (sigma, clip) of jitter, or None.
        dropout: max_ratio of point_dropout.
    """

    def __init__(self, scale=(0.8, 1.25), anisotropic=True, shift=0.1, rotate=False, up_axis=1,
                 jitter=(0.01, 0.05), dropout=0.0):
        self.scale, self.anisotropic, self.shift = scale, anisotropic, shift
        self.rotate, self.up_axis, self.jitter, self.dropout = rotate, up_axis, jitter, dropout

    def __call__(self, xyz: Tensor, generator=None) -> Tensor:
        if self.scale:
            xyz = random_scale(xyz, *self.scale, anisotropic=self.anisotropic, generator=generator)
        if self.shift:
            xyz = random_shift(xyz, self.shift, generator=generator)
        if self.rotate:
            xyz = rotate_up(xyz, self.up_axis, generator=generator)
        if self.jitter:
            xyz = jitter(xyz, *self.jitter, generator=generator)
        if self.dropout:
            xyz = point_dropout(xyz, self.dropout, generator=generator)
        return xyz

    def label_preserving(self) -> "Augment":
        """The same augmentation without point dropout: the copies of test-time voting."""
        return Augment(self.scale, self.anisotropic, self.shift, self.rotate, self.up_axis, self.jitter, 0.0)

    def __repr__(self) -> str:
        scale = f"({self.scale[0]:.3g}, {self.scale[1]:.3g})" if self.scale else None
        return (f"Augment(scale={scale}, anisotropic={self.anisotropic}, shift={self.shift:g}, "
                f"rotate={self.rotate}, up_axis={self.up_axis}, jitter={self.jitter}, dropout={self.dropout:g})")
