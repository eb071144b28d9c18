"""Readers for the ModelNet40 files people have on disk: the npz of shared/data
(read_modelnet40_npz), the HDF5 release ply_data_*.h5 (read_modelnet40_h5, needs h5py) and the
modelnet40_normal_resampled text layout (read_modelnet40_txt). Each returns PointClouds and fails
with the file name and what is wrong with it.
"""
import os
import re
from typing import List, Tuple

import numpy as np
import torch

from .clouds import PointClouds

__all__ = ["read_modelnet40_npz", "read_modelnet40_h5", "read_modelnet40_txt"]


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
