"""Data for the PointNet++ classifiers, one module per concern; this module keeps load_data (the
training command's --data) and re-exports the names of the others, so `from models.data import
...` keeps working.

Shapes: S shapes in a data set, P points stored per shape, B batch, N points per sample.

- clouds.py:     PointClouds, the in-memory data set every source returns
- shapes.py:     ProceduralShapes, the built-in procedural set
- modelnet40.py: the ModelNet40 readers (npz of shared/data, HDF5 release, normal_resampled txt)
- augment.py:    batched augmentations on the device (random_subset, ..., Augment)
- loader.py:     DeviceLoader, batches of a data set held whole on the device
"""
import os
from typing import Optional, Tuple

import torch

from .augment import Augment, jitter, point_dropout, random_scale, random_shift, random_subset, rotate_up
from .clouds import PointClouds
from .loader import DeviceLoader
from .modelnet40 import _fail, read_modelnet40_h5, read_modelnet40_npz, read_modelnet40_txt
from .shapes import ProceduralShapes

__all__ = [
    "PointClouds",
    "ProceduralShapes",
    "read_modelnet40_npz",
    "read_modelnet40_h5",
    "read_modelnet40_txt",
    "load_data",
    "load_split",
    "random_subset",
    "random_scale",
    "random_shift",
    "jitter",
    "rotate_up",
    "point_dropout",
    "Augment",
    "DeviceLoader",
]


def load_data(spec: str, *, num_points: int = 1024, seed: int = 0, num_shapes: int = 4000,
              num_val_shapes: int = 1000, val_split: str = "file") -> Tuple[PointClouds, Optional[PointClouds]]:
    """(train, val) for the training command.

    spec: "builtin" (ProceduralShapes, train and val streams of the same seed), an .npz file
    (the file's val mask), a folder of ply_data_*.h5 files (train / test splits) or a
    modelnet40_normal_resampled folder (train / test lists). val_split "none": (all the shapes
    to train on, None): an npz's train and val shapes, a folder's train split, the builtin train
    stream.
    """
    if val_split not in ("file", "none"):
        raise ValueError(f"val_split must be 'file' or 'none', got {val_split!r}")
    train, val = _load(spec, num_points, seed, num_shapes, num_val_shapes, val_split == "file")
    if val_split == "none":
        return train, None
    return train, val


def load_split(spec: str, split: Optional[str] = None, *, num_points: int = 1024, seed: int = 0,
               num_shapes: int = 1000) -> Tuple[PointClouds, str]:
    """One labelled split for models.evaluate -> (shapes, split name). split None: the split a
    training run validates on (npz: 'val', folders: 'test', builtin: 'val'). npz: 'val', 'train'
    (its non-val shapes) or 'all'; folders: 'train' or 'test'; builtin: 'train', 'val' or
    'test' (num_shapes shapes of that stream)."""
    if spec == "builtin":
        split = split or "val"
        return ProceduralShapes(num_shapes, num_points, seed, split).materialize(), split
    if spec.endswith(".npz") or os.path.isfile(spec):
        split = split or "val"
        if split not in ("val", "train", "all"):
            raise ValueError(f"{spec}: an npz has the splits 'val', 'train' and 'all', not {split!r}")
        train, val = read_modelnet40_npz(spec)
        if split == "all":
            return PointClouds(torch.cat([train.points, val.points]), torch.cat([train.labels, val.labels]),
                               train.classes), split
        return (val if split == "val" else train), split
    split = split or "test"
    if split not in ("train", "test"):
        raise ValueError(f"{spec}: a ModelNet40 folder has the splits 'train' and 'test', not {split!r}")
    return _read_folder(spec, split, num_points), split


def _read_folder(spec, split, num_points):
    if not os.path.isdir(spec):
        raise ValueError(f"{spec}: no such file or folder (--data takes 'builtin', an .npz file or a folder)")
    names = os.listdir(spec)
    if any(n.startswith("ply_data_") and n.endswith(".h5") for n in names):
        return read_modelnet40_h5(spec, split)
    if "modelnet40_shape_names.txt" in names:
        return read_modelnet40_txt(spec, split, num_points)
    _fail(spec, "neither ply_data_*.h5 files nor modelnet40_shape_names.txt found")


def _load(spec, num_points, seed, num_shapes, num_val_shapes, with_val):
    if spec == "builtin":
        train = ProceduralShapes(num_shapes, num_points, seed, "train").materialize()
        return train, ProceduralShapes(num_val_shapes, num_points, seed, "val").materialize() if with_val else None
    if spec.endswith(".npz") or os.path.isfile(spec):
        train, val = read_modelnet40_npz(spec)
        if with_val:
            return train, val
        return PointClouds(torch.cat([train.points, val.points]), torch.cat([train.labels, val.labels]),
                           train.classes), None
    train = _read_folder(spec, "train", num_points)
    return train, _read_folder(spec, "test", num_points) if with_val else None
