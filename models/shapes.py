"""The built-in procedural data set: ten classes of parametric surfaces, generated on the fly
from (seed, split, index): no files, no downloads, the same points on every machine.

Each sampler draws n points on the surface of one shape in a canonical pose, about unit size,
with its shape parameters drawn from rng. Faces are chosen in proportion to their area, so the
density is about uniform except where noted.
"""
import math
from typing import Callable, Dict, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .clouds import PointClouds

__all__ = ["ProceduralShapes"]


def _pick_parts(rng, n, areas):
    """Which part of a surface each of n points lands on, in proportion to the parts' areas."""
    p = np.asarray(areas, dtype=np.float64)
    return rng.choice(len(p), size=n, p=p / p.sum())


def _unit_vectors(rng, n):
    v = rng.standard_normal((n, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _disk(rng, n, r):
    """n points uniform on the disk of radius r in the xy plane, as (x, y)."""
    rho = r * np.sqrt(rng.random(n))
    phi = rng.random(n) * 2 * np.pi
    return rho * np.cos(phi), rho * np.sin(phi)


def _sphere(rng, n):
    return _unit_vectors(rng, n)


def _ellipsoid(rng, n):
    # a sphere stretched by three distinct semi-axes (density not exactly uniform)
    axes = np.array([1.0, rng.uniform(0.45, 0.75), rng.uniform(0.2, 0.4)])
    return _unit_vectors(rng, n) * axes


def _box(rng, n):
    h = rng.uniform(0.35, 1.0, 3)  # half extents
    areas = [h[1] * h[2], h[0] * h[2], h[0] * h[1]]  # faces normal to x, y, z (two of each)
    axis = _pick_parts(rng, n, areas)
    p = rng.uniform(-1, 1, (n, 3)) * h
    p[np.arange(n), axis] = np.where(rng.random(n) < 0.5, -1.0, 1.0) * h[axis]
    return p


def _cylinder(rng, n):
    r, h = rng.uniform(0.3, 0.6), rng.uniform(0.6, 1.0)
    part = _pick_parts(rng, n, [2 * np.pi * r * 2 * h, np.pi * r * r, np.pi * r * r])
    phi = rng.random(n) * 2 * np.pi
    p = np.stack([r * np.cos(phi), r * np.sin(phi), rng.uniform(-h, h, n)], 1)
    for cap, z in ((1, h), (2, -h)):
        m = part == cap
        p[m, 0], p[m, 1] = _disk(rng, m.sum(), r)
        p[m, 2] = z
    return p


def _cone(rng, n):
    r, h = rng.uniform(0.4, 0.8), rng.uniform(0.8, 1.4)
    slant = math.hypot(r, h)
    part = _pick_parts(rng, n, [np.pi * r * slant, np.pi * r * r])
    t = np.sqrt(rng.random(n))  # distance from the apex, as a fraction: uniform on the lateral area
    phi = rng.random(n) * 2 * np.pi
    p = np.stack([t * r * np.cos(phi), t * r * np.sin(phi), h / 2 - t * h], 1)
    base = part == 1
    p[base, 0], p[base, 1] = _disk(rng, base.sum(), r)
    p[base, 2] = -h / 2
    return p


def _torus(rng, n):
    R, r = rng.uniform(0.6, 0.8), rng.uniform(0.12, 0.3)
    out = np.empty((0, 3))
    while len(out) < n:  # rejection on the tube angle makes the density uniform on the surface
        u, v = rng.random((2, 2 * n)) * 2 * np.pi
        keep = rng.random(2 * n) < (R + r * np.cos(v)) / (R + r)
        u, v = u[keep], v[keep]
        ring = R + r * np.cos(v)
        out = np.concatenate([out, np.stack([ring * np.cos(u), ring * np.sin(u), r * np.sin(v)], 1)])
    return out[:n]


def _triangles(rng, n, tris):
    """n points uniform on a union of triangles tris[T,3,3]."""
    tris = np.asarray(tris, dtype=np.float64)
    areas = 0.5 * np.linalg.norm(np.cross(tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0]), axis=1)
    t = _pick_parts(rng, n, areas)
    a, b = rng.random((2, n))
    flip = a + b > 1
    a[flip], b[flip] = 1 - a[flip], 1 - b[flip]
    v0, v1, v2 = tris[t, 0], tris[t, 1], tris[t, 2]
    return v0 + a[:, None] * (v1 - v0) + b[:, None] * (v2 - v0)


def _pyramid(rng, n):
    a, h = rng.uniform(0.5, 0.8), rng.uniform(0.8, 1.4)
    c = np.array([[a, a], [-a, a], [-a, -a], [a, -a]])
    base = np.c_[c, np.full(4, -h / 2)]
    apex = np.array([0.0, 0.0, h / 2])
    sides = [[base[i], base[(i + 1) % 4], apex] for i in range(4)]
    return _triangles(rng, n, sides + [[base[0], base[1], base[2]], [base[0], base[2], base[3]]])


def _capsule(rng, n):
    r, h = rng.uniform(0.25, 0.45), rng.uniform(0.3, 0.6)
    part = _pick_parts(rng, n, [2 * np.pi * r * 2 * h, 4 * np.pi * r * r])
    phi = rng.random(n) * 2 * np.pi
    p = np.stack([r * np.cos(phi), r * np.sin(phi), rng.uniform(-h, h, n)], 1)
    ends = part == 1
    s = _unit_vectors(rng, ends.sum()) * r
    s[:, 2] += np.where(s[:, 2] >= 0, h, -h)  # two hemispheres closing the tube
    p[ends] = s
    return p


def _helix(rng, n):
    R, turns, tube = rng.uniform(0.4, 0.7), rng.uniform(2.0, 4.0), rng.uniform(0.04, 0.09)
    pitch = rng.uniform(0.5, 0.8) / turns  # rise per turn, total height 0.5-0.8 before rescaling
    t = rng.random(n) * turns * 2 * np.pi
    centre = np.stack([R * np.cos(t), R * np.sin(t), pitch * t / (2 * np.pi)], 1)
    tangent = np.stack([-R * np.sin(t), R * np.cos(t), np.full(n, pitch / (2 * np.pi))], 1)
    tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
    normal = np.stack([-np.cos(t), -np.sin(t), np.zeros(n)], 1)
    binormal = np.cross(tangent, normal)
    a = rng.random(n) * 2 * np.pi
    p = centre + tube * (np.cos(a)[:, None] * normal + np.sin(a)[:, None] * binormal)
    p[:, 2] -= pitch * turns / 2
    return p


def _plane(rng, n):
    a, b = rng.uniform(0.5, 1.0), rng.uniform(0.3, 1.0)
    return np.stack([rng.uniform(-a, a, n), rng.uniform(-b, b, n), np.zeros(n)], 1)


_SHAPES: Dict[str, Callable] = {
    "sphere": _sphere, "box": _box, "cylinder": _cylinder, "cone": _cone, "torus": _torus,
    "pyramid": _pyramid, "capsule": _capsule, "helix": _helix, "plane": _plane, "ellipsoid": _ellipsoid,
}
_SPLITS = {"train": 0, "val": 1, "test": 2}


def _random_rotation(rng):
    """A rotation matrix uniform on SO(3) (QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q *= np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _rotation_about_y(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


# the samplers build shapes with z up; the data set is y up, like the ModelNet40 files
_Z_UP_TO_Y_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


class ProceduralShapes(Dataset):
    """A built-in classification data set of parametric surfaces, generated on the fly.

    Ten classes (sphere, box, cylinder, cone, torus, pyramid, capsule, helix, plane, ellipsoid),
    each shape with random proportions, scaled so that its farthest point lies at a random radius
    in [0.6, 1], randomly rotated, sampled on its surface and jittered with Gaussian noise.
    Shape i is class i % 10 and depends only on (seed, split, i): the set is the same on every
    machine and in any access order.

    Args:
        num_shapes: S.
        num_points: points per shape P.
        seed: the data set's seed.
        split: "train", "val" or "test": disjoint random streams from the same seed.
        noise: standard deviation of the Gaussian jitter.
        rotation: "up" (y is up, as in ModelNet40: upright shapes tilted by up to 15 degrees,
            then turned by a uniform angle about y) or "so3" (uniform 3-D rotations, harder).
    """

    classes = tuple(_SHAPES)

    def __init__(self, num_shapes: int = 4000, num_points: int = 1024, seed: int = 0,
                 split: str = "train", noise: float = 0.01, rotation: str = "up"):
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
        if rotation not in ("up", "so3"):
            raise ValueError(f"rotation must be 'up' or 'so3', got {rotation!r}")
        self.num_shapes, self.num_points, self.seed, self.split = num_shapes, num_points, seed, split
        self.noise, self.rotation = noise, rotation

    def __len__(self) -> int:
        return self.num_shapes

    def __getitem__(self, i: int) -> Tuple[Tensor, Tensor]:
        if not 0 <= i < self.num_shapes:
            raise IndexError(f"shape index {i} out of range [0, {self.num_shapes})")
        label = i % len(self.classes)
        rng = np.random.default_rng([self.seed, _SPLITS[self.split], i])
        p = _SHAPES[self.classes[label]](rng, self.num_points)
        p = p - 0.5 * (p.max(0) + p.min(0))  # centre the bounding box
        p = p * (rng.uniform(0.6, 1.0) / np.linalg.norm(p, axis=1).max())
        if self.rotation == "so3":
            rot = _random_rotation(rng)
        else:  # a small tilt about a random horizontal axis, then a turn about y
            axis = _rotation_about_y(rng.uniform(0, 2 * np.pi)) @ np.array([1.0, 0.0, 0.0])
            tilt = np.deg2rad(rng.uniform(0, 15))
            k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
            rot = np.eye(3) + np.sin(tilt) * k + (1 - np.cos(tilt)) * k @ k  # Rodrigues
            rot = _rotation_about_y(rng.uniform(0, 2 * np.pi)) @ rot @ _Z_UP_TO_Y_UP
        p = p @ rot.T + rng.normal(0.0, self.noise, p.shape)
        return torch.from_numpy(p.astype(np.float32)), torch.tensor(label)

    def materialize(self) -> PointClouds:
        """All shapes as one in-memory PointClouds (about 0.1 ms per 1024-point shape)."""
        pts, labels = zip(*(self[i] for i in range(len(self))))
        return PointClouds(torch.stack(pts), torch.stack(labels), self.classes)
