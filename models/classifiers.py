"""The classifiers the commands know by name (train --model, a checkpoint's spec): the PointNet++
variants of pointnet2.py and the DGCNN of dgcnn.py."""
from torch import nn

from .dgcnn import DGCNN
from .pointnet2 import MODELS as POINTNET2_MODELS, build_model

__all__ = ["CLASSIFIERS", "build_classifier", "describe"]

CLASSIFIERS = tuple(POINTNET2_MODELS) + ("dgcnn",)


def build_classifier(name: str, num_classes: int, *, grouping: str = "ball", dropout: float = 0.5,
                     k: int = 20, knn_backend: str = "pcops") -> nn.Module:
    """'ssg', 'msg', 'ssg-lite' (PointNet++; grouping) or 'dgcnn' (k, knn_backend) -> the
    classifier with num_classes outputs and head dropout."""
    if name == "dgcnn":
        return DGCNN(num_classes, k=k, dropout=dropout, knn_backend=knn_backend)
    if name not in POINTNET2_MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(CLASSIFIERS)}")
    return build_model(name, num_classes, grouping=grouping, dropout=dropout)


def describe(name: str, grouping: str = "ball", k: int = 20, knn_backend: str = "pcops") -> str:
    """'PointNet++ ssg (ball grouping)' or 'DGCNN (k=20, pcops kNN)': for logs and plot titles."""
    if name == "dgcnn":
        return f"DGCNN (k={k}, {knn_backend} kNN)"
    return f"PointNet++ {name} ({grouping} grouping)"
