"""PointNet++ classification on pcops: the models (pointnet2), data (data and the modules it
re-exports), and the commands ``python -m models.train``, ``models.evaluate`` and
``models.predict``; models/README.md has the map of the files."""
from .pointnet2 import MSG, SSG, SSG_LITE, PointNet2Classifier, SAConfig, SetAbstraction, SharedMLP, build_model

__all__ = ["MSG", "SSG", "SSG_LITE", "PointNet2Classifier", "SAConfig", "SetAbstraction", "SharedMLP", "build_model"]
