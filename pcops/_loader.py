"""Loads pcops._C and checks that it was built for the torch that is running."""
import importlib

import torch

_REBUILD = "Rebuild it with: pip install --no-build-isolation -e <path to pcops>"


def load_library():
    try:
        build_info = importlib.import_module("pcops._build_info")
    except ImportError as e:
        raise ImportError(f"pcops is not built (pcops/_build_info.py is missing). {_REBUILD}") from e

    running = (torch.__version__, torch.version.cuda)
    built = (build_info.TORCH_VERSION, build_info.TORCH_CUDA_VERSION)
    if running != built:
        raise ImportError(
            f"pcops was built against torch {built[0]} (CUDA {built[1]}), but torch {running[0]} "
            f"(CUDA {running[1]}) is running: the compiled library does not match. {_REBUILD}"
        )
    try:
        importlib.import_module("pcops._C")
    except ImportError as e:
        raise ImportError(f"pcops._C could not be loaded ({e}). {_REBUILD}") from e
    return build_info
