"""Private: the paths of the ops that have several, and forcing one (tests, benchmarks).

Every path of an op returns the same bits; the op's plan chooses one by size and device
("auto"). Tests compare each path with the simple one, benchmarks time them side by side:

    from pcops._paths import force
    dist2, idx = force("knn", "grid", query, ref, 16)            # knn through the grid path
    idx, dist2 = force("furthest_point_sample", "tree", xyz, 512)

``force(op, path, *args)`` calls the private op ``torch.ops.pcops._<op>_path`` with the public
op's arguments (optional ones may be left out) and the path's id. A path that does not run on
the device or dtype of the inputs, or cannot take their sizes, raises ``ValueError``: a forced
path never falls back to another.

The tables below are the C tables of ``kernels/<op>_paths.h`` (names, ids and devices), written
out so that they can be read here; ``tests/test_paths.py`` checks that they are equal.
"""
from typing import Dict, Optional, Tuple

import torch

CPU, CUDA = "cpu", "cuda"
F32, ANY = ("float32",), ("float32", "float64")  # the compute dtype (float32 for half inputs)

# op -> {path name: (id, devices, dtypes)}, in id order; "auto" (0) lets the plan choose.
PATHS: Dict[str, Dict[str, Tuple[int, Tuple[str, ...], Tuple[str, ...]]]] = {
    "furthest_point_sample": {
        "auto": (0, (CPU, CUDA), ANY),
        "simple": (1, (CPU, CUDA), ANY),
        "tree": (2, (CPU,), ANY),
        "warp": (3, (CUDA,), ANY),
        "block": (4, (CUDA,), ANY),
        "cluster": (5, (CUDA,), ANY),
        "grid": (6, (CUDA,), ANY),
        "bucket": (7, (CUDA,), ANY),
        "bucket_groups": (8, (CUDA,), F32),
        "bucket_rounds": (9, (CUDA,), F32),
        "bucket_rounds_cluster": (10, (CUDA,), F32),
        "block_pruned": (11, (CUDA,), ANY),
    },
    "knn": {
        "auto": (0, (CPU, CUDA), ANY),
        "brute": (1, (CPU, CUDA), ANY),
        "grid": (2, (CPU, CUDA), ANY),
        "brute_heap": (3, (CUDA,), ANY),
        "grid_baseline": (4, (CPU, CUDA), ANY),
        "warp_select": (5, (CUDA,), F32),
        "grid_select": (6, (CUDA,), F32),
        "grid_batch": (7, (CUDA,), F32),
        "brute_blocked": (8, (CPU,), F32),
        "tc": (9, (CUDA,), F32),
    },
    "ball_query": {
        "auto": (0, (CPU, CUDA), ANY),
        "brute": (1, (CPU, CUDA), ANY),
        "grid": (2, (CPU, CUDA), ANY),
        "brute_split": (3, (CUDA,), ANY),
        "split_sorted": (4, (CUDA,), ANY),
    },
    "circle_nms": {
        "auto": (0, (CPU, CUDA), ANY),
        "grid": (1, (CUDA,), ANY),
        "block": (2, (CUDA,), ANY),
        "flow": (3, (CUDA,), ANY),
        "sweep": (4, (CPU,), ANY),
    },
}


def paths(op: str, device: str, dtype: Optional[torch.dtype] = None) -> Tuple[str, ...]:
    """The paths of ``op`` that run on ``device`` ("cpu" or "cuda") and, when given, for inputs
    of ``dtype``; "auto" excluded."""
    compute = None
    if dtype is not None:
        compute = "float64" if dtype == torch.float64 else "float32"
    return tuple(name for name, (_, devices, dtypes) in PATHS[op].items()
                 if name != "auto" and device in devices and (compute is None or compute in dtypes))


def force(op: str, path: str, *args):
    """``op(*args)`` through the path named ``path`` (see the module's docstring)."""
    try:
        path_id = PATHS[op][path][0]
    except KeyError:
        known = ", ".join(f"{o}: {', '.join(p)}" for o, p in PATHS.items())
        raise ValueError(f"pcops._paths.force: no path {path!r} of op {op!r} ({known})") from None
    private = getattr(torch.ops.pcops, f"_{op}_path").default
    missing = len(private._schema.arguments) - 1 - len(args)
    return private(*args, *([None] * missing), path_id)
