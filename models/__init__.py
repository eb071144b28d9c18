"""PointNet++ classification on pcops: the models (pointnet2), data (data) and the training
command (``python -m models.train``)."""
from .pointnet2 import MSG, SSG, SSG_LITE, PointNet2Classifier, SAConfig, SetAbstraction, SharedMLP, build_model

__all__ = ["MSG", "SSG", "SSG_LITE", "PointNet2Classifier", "SAConfig", "SetAbstraction", "SharedMLP", "build_model"]
