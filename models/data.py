"""Data for the PointNet++ classifiers: a built-in procedural data set, ModelNet40 readers,
batched augmentations and a device-resident batch loader.

Shapes: S shapes in a data set, P points stored per shape, B batch, N points per sample.

- ProceduralShapes: ten classes of parametric surfaces, generated on the fly from (seed, split,
  index): no files, no downloads, the same points on every machine.
- Readers for the ModelNet40 files people have on disk: the npz of shared/data
  (read_modelnet40_npz), the HDF5 release ply_data_*.h5 (read_modelnet40_h5, needs h5py) and the
  modelnet40_normal_resampled text layout (read_modelnet40_txt). Each returns PointClouds and
  fails with the file name and what is wrong with it.
- Augmentations are small functions on a batch xyz[B,N,3] that run on the batch's device and
  draw from an explicit torch.Generator, so a GPU batch is augmented on the GPU with no host sync.
- DeviceLoader keeps a whole data set on the device (ModelNet40 is 9843 x 736 x 3) and yields
  batches by indexing it: no DataLoader workers, no host-to-device copy per step.
"""
import math
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, DistributedSampler

__all__ = [
    "PointClouds",
    "ProceduralShapes",
    "read_modelnet40_npz",
    "read_modelnet40_h5",
    "read_modelnet40_txt",
    "load_data",
    "random_subset",
    "random_scale",
    "random_shift",
    "jitter",
    "rotate_up",
    "point_dropout",
    "Augment",
    "DeviceLoader",
]


class PointClouds(Dataset):
    """An in-memory classification data set: points[S,P,3] float32, labels[S] int64, class names.

    Item i is (points[i] [P,3], labels[i]). All readers and ProceduralShapes.materialize() return
    one of these; .to(device) moves it whole (used by DeviceLoader).
    """

    def __init__(self, points: Tensor, labels: Tensor, classes: Sequence[str]):
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must be [S, P, 3], got {tuple(points.shape)}")
        if labels.shape != points.shape[:1]:
            raise ValueError(f"labels must be [S] = [{points.shape[0]}], got {tuple(labels.shape)}")
        self.points = points.float()
        self.labels = labels.long()
        self.classes = list(classes)

    def __len__(self) -> int:
        return self.points.shape[0]

    def __getitem__(self, i: int) -> Tuple[Tensor, Tensor]:
        return self.points[i], self.labels[i]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def to(self, device) -> "PointClouds":
        return PointClouds(self.points.to(device), self.labels.to(device), self.classes)

    def __repr__(self) -> str:
        return f"PointClouds({len(self)} shapes x {self.points.shape[1]} points, {self.num_classes} classes)"


# ---------------------------------------------------------------------------------------------
# the built-in procedural data set
#
# Each sampler draws n points on the surface of one shape in a canonical pose, about unit size,
# with its shape parameters drawn from rng. Faces are chosen in proportion to their area, so the
# density is about uniform except where noted.


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


# ---------------------------------------------------------------------------------------------
# ModelNet40 readers


def _fail(path, what) -> None:
    raise ValueError(f"{path}: {what}")


def _check_points(path, name, pts, labels_name, labels) -> None:
    if pts.ndim != 3 or pts.shape[-1] < 3 or pts.shape[0] == 0 or pts.shape[1] == 0:
        _fail(path, f"'{name}' must be [shapes, points, 3], got shape {pts.shape}")
    if not np.issubdtype(pts.dtype, np.floating):
        _fail(path, f"'{name}' must be floating point, got {pts.dtype}")
    if labels.shape != (pts.shape[0],):
        _fail(path, f"'{labels_name}' must hold one label per shape ({pts.shape[0]}), got shape {labels.shape}")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        _fail(path, f"'{labels_name}' must be non-negative integers, got {labels.dtype} min {labels.min()}")


def read_modelnet40_npz(path: str) -> Tuple[PointClouds, PointClouds]:
    """The ModelNet40 npz of shared/data -> (train, val), split by its 'val' mask.

    Keys: points float16 [S,P,3] (y up, unit sphere), labels uint8 [S], classes [40] str,
    val bool [S]. Shapes keep all P points (736 in that file).
    """
    try:
        f = np.load(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read as a numpy .npz file ({e})") from e
    with f:
        missing = [k for k in ("points", "labels", "classes", "val") if k not in f.files]
        if missing:
            _fail(path, f"missing key(s) {missing}; the file has {sorted(f.files)}")
        pts, labels, classes, val = f["points"], f["labels"], f["classes"], f["val"]
    _check_points(path, "points", pts, "labels", labels)
    if val.shape != labels.shape or val.dtype != np.bool_:
        _fail(path, f"'val' must be a bool mask of shape {labels.shape}, got {val.dtype} {val.shape}")
    if labels.size and labels.max() >= len(classes):
        _fail(path, f"label {labels.max()} but only {len(classes)} classes")
    pts = torch.from_numpy(pts[..., :3].astype(np.float32))
    labels = torch.from_numpy(labels.astype(np.int64))
    val = torch.from_numpy(val)
    classes = [str(c) for c in classes]
    return PointClouds(pts[~val], labels[~val], classes), PointClouds(pts[val], labels[val], classes)


def _read_names(path) -> List[str]:
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from e


def read_modelnet40_h5(root: str, split: str = "train") -> PointClouds:
    """The HDF5 release (modelnet40_ply_hdf5_2048): every root/ply_data_<split>*.h5, in numeric
    order, each with datasets 'data' [n,P,3] float and 'label' [n,1] int. Class names come from
    root/shape_names.txt when it exists (else "0".."39"). Needs h5py.
    """
    try:
        import h5py
    except ImportError as e:
        raise ImportError("reading ModelNet40 HDF5 files needs h5py: pip install h5py") from e
    pattern = re.compile(rf"ply_data_{re.escape(split)}(\d*)\.h5$")
    try:
        names = [n for n in os.listdir(root) if pattern.match(n)]
    except OSError as e:
        raise ValueError(f"{root}: cannot list the folder ({e.strerror})") from e
    if not names:
        _fail(root, f"no ply_data_{split}*.h5 files")
    names.sort(key=lambda n: int(pattern.match(n).group(1) or -1))
    pts, labels = [], []
    for name in names:
        path = os.path.join(root, name)
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise ValueError(f"{path}: cannot read as HDF5 ({e})") from e
        with f:
            missing = [k for k in ("data", "label") if k not in f]
            if missing:
                _fail(path, f"missing dataset(s) {missing}; the file has {sorted(f.keys())}")
            p, lab = f["data"][...], f["label"][...]
        lab = lab.reshape(-1) if lab.ndim == 2 and lab.shape[1] == 1 else lab
        _check_points(path, "data", p, "label", lab)
        if pts and p.shape[1] != pts[0].shape[1]:
            _fail(path, f"{p.shape[1]} points per shape, but {names[0]} has {pts[0].shape[1]}")
        pts.append(p[..., :3].astype(np.float32))
        labels.append(lab.astype(np.int64))
    labels = np.concatenate(labels)
    names_file = os.path.join(root, "shape_names.txt")
    classes = _read_names(names_file) if os.path.exists(names_file) else [str(i) for i in range(labels.max() + 1)]
    if labels.max() >= len(classes):
        _fail(names_file, f"lists {len(classes)} classes, but the data has label {labels.max()}")
    return PointClouds(torch.from_numpy(np.concatenate(pts)), torch.from_numpy(labels), classes)


def read_modelnet40_txt(root: str, split: str = "train", num_points: int = 1024) -> PointClouds:
    """The modelnet40_normal_resampled layout: root/modelnet40_shape_names.txt (classes, one per
    line), root/modelnet40_<split>.txt (shape ids such as airplane_0001) and root/<class>/<id>.txt
    (rows "x,y,z,nx,ny,nz", 10000 per file). Keeps the first num_points points of each shape
    (the rows are in random order) and drops the normals. Reading all 9843 train shapes takes
    a while: cache the result (torch.save) if you read it often.
    """
    classes = _read_names(os.path.join(root, "modelnet40_shape_names.txt"))
    index = {c: i for i, c in enumerate(classes)}
    list_file = os.path.join(root, f"modelnet40_{split}.txt")
    ids = _read_names(list_file)
    if not ids:
        _fail(list_file, "lists no shapes")
    pts = np.empty((len(ids), num_points, 3), dtype=np.float32)
    labels = np.empty(len(ids), dtype=np.int64)
    for k, shape_id in enumerate(ids):
        cls = shape_id.rsplit("_", 1)[0]
        if cls not in index:
            _fail(list_file, f"shape id {shape_id!r} (line {k + 1}) is not of a class in modelnet40_shape_names.txt")
        path = os.path.join(root, cls, shape_id + ".txt")
        try:
            rows = np.loadtxt(path, delimiter=",", max_rows=num_points, ndmin=2, dtype=np.float32)
        except OSError as e:
            raise ValueError(f"{path}: cannot read ({e})") from e
        except ValueError as e:
            raise ValueError(f"{path}: expected rows of comma-separated numbers x,y,z,nx,ny,nz ({e})") from e
        if rows.shape[1] < 3:
            _fail(path, f"expected rows of at least 3 values (x,y,z,...), got {rows.shape[1]}")
        if rows.shape[0] < num_points:
            _fail(path, f"has {rows.shape[0]} points, fewer than the {num_points} asked for")
        pts[k], labels[k] = rows[:, :3], index[cls]
    return PointClouds(torch.from_numpy(pts), torch.from_numpy(labels), classes)


def load_data(spec: str, *, num_points: int = 1024, seed: int = 0, num_shapes: int = 4000,
              num_val_shapes: int = 1000) -> Tuple[PointClouds, PointClouds]:
    """(train, val) for the training command.

    spec: "builtin" (ProceduralShapes, train and val streams of the same seed), an .npz file
    (the file's val mask), a folder of ply_data_*.h5 files (train / test splits) or a
    modelnet40_normal_resampled folder (train / test lists).
    """
    if spec == "builtin":
        train = ProceduralShapes(num_shapes, num_points, seed, "train").materialize()
        return train, ProceduralShapes(num_val_shapes, num_points, seed, "val").materialize()
    if spec.endswith(".npz") or os.path.isfile(spec):
        return read_modelnet40_npz(spec)
    if not os.path.isdir(spec):
        raise ValueError(f"{spec}: no such file or folder (--data takes 'builtin', an .npz file or a folder)")
    names = os.listdir(spec)
    if any(n.startswith("ply_data_") and n.endswith(".h5") for n in names):
        return read_modelnet40_h5(spec, "train"), read_modelnet40_h5(spec, "test")
    if "modelnet40_shape_names.txt" in names:
        return read_modelnet40_txt(spec, "train", num_points), read_modelnet40_txt(spec, "test", num_points)
    _fail(spec, "neither ply_data_*.h5 files nor modelnet40_shape_names.txt found")


# ---------------------------------------------------------------------------------------------
# batched augmentations: xyz[B,N,3] -> xyz[B,N,3], drawn on xyz's device from `generator`


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

    def __repr__(self) -> str:
        scale = f"({self.scale[0]:.3g}, {self.scale[1]:.3g})" if self.scale else None
        return (f"Augment(scale={scale}, anisotropic={self.anisotropic}, shift={self.shift:g}, "
                f"rotate={self.rotate}, up_axis={self.up_axis}, jitter={self.jitter}, dropout={self.dropout:g})")


# ---------------------------------------------------------------------------------------------
# device-resident batches


class DeviceLoader:
    """Batches (xyz[B,N,3], labels[B], valid[B]) of a PointClouds held whole on `device`.

    Training (train=True): each epoch a DistributedSampler (seeded, set_epoch) shuffles the
    shapes and gives this process its 1/world share; every batch is full (the remainder is
    dropped), each cloud is reduced to a random subset of N points in random order and
    `augment` runs on the device with `generator`.

    Evaluation (train=False): this process's shapes are i = rank, rank + world, ... in order,
    each cloud keeps its first N points, and the last batch is padded to the full batch size by
    repeating shape 0 with valid = False, so every batch has the same shape (no recompilation
    under torch.compile); count only the valid rows.
    """

    def __init__(self, data: PointClouds, batch_size: int, num_points: int, device, *, train: bool,
                 augment: Optional[Callable] = None, generator: Optional[torch.Generator] = None,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if num_points > data.points.shape[1]:
            raise ValueError(f"--points {num_points} but the data has {data.points.shape[1]} points per shape")
        self.data = data.to(device)
        self.batch_size, self.num_points, self.train = batch_size, num_points, train
        self.augment, self.generator = augment, generator
        self.rank, self.world_size = rank, world_size
        self.sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=seed, drop_last=True) if train else None
        if train and len(self.sampler) < batch_size:
            raise ValueError(f"{len(data)} shapes over {world_size} process(es) do not fill one batch of {batch_size}")

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.train:
            return len(self.sampler) // self.batch_size
        return -(-len(range(self.rank, len(self.data), self.world_size)) // self.batch_size)

    def __iter__(self):
        dev = self.data.points.device
        if self.train:
            order = torch.tensor(list(self.sampler), dtype=torch.long).to(dev, non_blocking=True)
            valid = torch.ones(len(order), dtype=torch.bool, device=dev)
        else:
            order = torch.arange(self.rank, len(self.data), self.world_size, device=dev)
            n_valid, pad = len(order), len(self) * self.batch_size - len(order)
            order = torch.cat([order, order.new_zeros(pad)])
            valid = torch.arange(len(order), device=dev) < n_valid
        for k in range(len(self)):
            sel = order[k * self.batch_size:(k + 1) * self.batch_size]
            xyz = self.data.points[sel]                                    # [B,P,3]
            if self.train:
                xyz = random_subset(xyz, self.num_points, self.generator)  # [B,N,3]
                if self.augment is not None:
                    xyz = self.augment(xyz, self.generator)
            else:
                xyz = xyz[:, :self.num_points]
            yield xyz, self.data.labels[sel], valid[k * self.batch_size:(k + 1) * self.batch_size]
