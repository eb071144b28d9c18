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
from typing import Tuple

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
