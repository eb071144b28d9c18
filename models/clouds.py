"""PointClouds: an in-memory classification data set (points, labels, class names), what every
reader and the procedural set return and what the loader moves to the device."""
from typing import Sequence, Tuple

from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["PointClouds"]


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

