"""PointNet++ and DGCNN classification on pcops: the models (pointnet2, dgcnn; classifiers maps
the names), data (data and the modules it re-exports), and the commands ``python -m
models.train``, ``models.evaluate`` and ``models.predict``; models/README.md has the map of the
files."""
from .classifiers import CLASSIFIERS, build_classifier
from .dgcnn import DGCNN, EdgeConv
from .pointnet2 import MSG, SSG, SSG_LITE, PointNet2Classifier, SAConfig, SetAbstraction, SharedMLP, build_model

__all__ = ["MSG", "SSG", "SSG_LITE", "PointNet2Classifier", "SAConfig", "SetAbstraction", "SharedMLP", "build_model",
           "DGCNN", "EdgeConv", "CLASSIFIERS", "build_classifier"]
