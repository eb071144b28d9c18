"""pcops: point-cloud ops for PyTorch, in C and CUDA C.

``import pcops`` loads the compiled library, which registers ``torch.ops.pcops.*``, and exposes
typed, documented wrappers:

    furthest_point_sample   greedy farthest point sampling, with the coverage radius curve
    knn                     k nearest neighbours, sorted, differentiable distances
    ball_query              the first neighbours within a radius
    ball_query_dist2        the same, padded with -1, with the distances (PyTorch3D's layout)
    neighbor_dist2          squared distances to listed neighbours (ball_query's idx), differentiable
    neighbor_edges          neighbour lists as COO edges [2, E] (torch_cluster's edge_index)
    group                   gather neighbour features, deterministic backward
    group_backward          that backward as an op of its own (sum of gathered gradients)
    circle_nms              greedy centre-distance NMS for 3-D detection
    circle_nms_mask         the same without host synchronisation (CUDA-graph capturable)
    io                      point-cloud file readers (npy/npz, PLY, KITTI .bin, PCD, LAS/LAZ)
    preprocess              inference preprocessing: normalise, FPS, kNN/ball query, group
    three_nn                the 3 nearest known points (feature propagation)
    interpolate             weighted gather of neighbour features, deterministic backward
    three_interpolate       interpolate under the PointNet++ name
    compat                  drop-in APIs of pointnet2_ops, PyTorch3D and torch_cluster
    set_debug_checks        also check index values (idx, lengths, start) on CUDA (host syncs)
"""
from ._loader import load_library as _load_library

_build_info = _load_library()

from ._debug import set_debug_checks  # noqa: E402
from .ball_query import ball_query, ball_query_dist2  # noqa: E402
from .circle_nms import circle_nms, circle_nms_mask  # noqa: E402
from .fps import furthest_point_sample  # noqa: E402
from .group import group, group_backward  # noqa: E402
from .knn import knn  # noqa: E402
from .neighbor_dist2 import neighbor_dist2  # noqa: E402
from .neighbor_edges import neighbor_edges  # noqa: E402
from . import three_nn_pointnet2 as _three_nn_pointnet2  # noqa: E402,F401  (the op's fake)
from . import io  # noqa: E402  (point-cloud file readers, the preprocess cache)
from . import preprocess  # noqa: E402  (a callable module: pcops.preprocess(clouds, npoint, nsample))
from .preprocess import GraphedPreprocess, Preprocessed, preprocess_stream  # noqa: E402
from .interpolate import interpolate, three_interpolate, three_nn  # noqa: E402
from . import compat  # noqa: E402
from . import _checks  # noqa: E402

_checks.reject_other_layouts()  # sparse, quantized, nested: a TypeError naming op and argument
for _name in ("ball_query", "ball_query_dist2", "circle_nms", "circle_nms_mask",
              "furthest_point_sample", "group", "group_backward", "knn", "neighbor_dist2",
              "neighbor_edges", "interpolate", "three_interpolate", "three_nn"):
    # TorchScript cannot compile the wrappers: scripting one says what to use instead
    _op = {"three_interpolate": "interpolate", "three_nn": "knn"}.get(_name, _name)
    _checks.script_unsupported(globals()[_name], _op)
del _name, _op

__version__ = "0.1.0"
WITH_CUDA: bool = _build_info.WITH_CUDA
"""Whether the CUDA kernels were compiled into this build."""

__all__ = [
    "WITH_CUDA",
    "ball_query",
    "ball_query_dist2",
    "circle_nms",
    "circle_nms_mask",
    "furthest_point_sample",
    "group",
    "group_backward",
    "knn",
    "neighbor_dist2",
    "neighbor_edges",
    "io",
    "preprocess",
    "GraphedPreprocess",
    "Preprocessed",
    "preprocess_stream",
    "compat",
    "interpolate",
    "three_interpolate",
    "three_nn",
    "set_debug_checks",
]
