"""Loads pcops._C: checks that the running torch can take it, then puts pcops' call hook in front
of every op (bindings/module.cpp).

The library is built on PyTorch's stable ABI for a target version (pcops/_build_info.py,
TORCH_TARGET), so it imports into that torch and every later one, whatever torch it was built
with; its CUDA kernels need torch's CUDA runtime of the major version they were compiled with.
"""
import importlib
import re

import torch

_REBUILD = "Rebuild it with: pip install --no-build-isolation -e <path to pcops>"

# The ops that synchronise with the host on CUDA (their output size depends on the data): their
# call hook reads torch.cuda's sync debug mode for the binding (bindings/utils.h).
_SYNCHRONISING = ("circle_nms", "neighbor_edges")


def _major_minor(version):
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


_RUNNING = object()


def check_torch(build_info, torch_version=_RUNNING, torch_cuda=_RUNNING):
    """Raises ImportError when a torch (torch_version, torch_cuda: by default the running one's;
    torch_cuda None for a torch without CUDA) cannot load this build of pcops: older than its
    stable-ABI target, or CUDA kernels of another CUDA major version (or a torch without CUDA)."""
    torch_version = torch.__version__ if torch_version is _RUNNING else torch_version
    torch_cuda = torch.version.cuda if torch_cuda is _RUNNING else torch_cuda
    target = tuple(build_info.TORCH_TARGET)
    supported = f"torch >= {target[0]}.{target[1]}"
    if _major_minor(torch_version) < target:
        raise ImportError(
            f"pcops {build_info.VERSION} supports {supported} (it is built on PyTorch's stable "
            f"ABI for {target[0]}.{target[1]} and imports into every later release), but torch "
            f"{torch_version} is running. Upgrade torch: pip install 'torch>={target[0]}.{target[1]}'")
    if not build_info.WITH_CUDA:
        return
    major = build_info.CUDA_MAJOR
    if not torch_cuda:
        raise ImportError(
            f"pcops {build_info.VERSION} holds CUDA {major} kernels, but torch {torch_version} has "
            f"no CUDA: install a CUDA {major} build of torch ({supported}), or the pcops wheel "
            f"for the CPU (+cpu), or build pcops from source. {_REBUILD}")
    if int(torch_cuda.split(".")[0]) != major:
        raise ImportError(
            f"pcops {build_info.VERSION} is built for CUDA {major} ({supported} with CUDA {major}), "
            f"but torch {torch_version} uses CUDA {torch_cuda}: install the pcops wheel for CUDA "
            f"{torch_cuda.split('.')[0]} (+cu{torch_cuda.split('.')[0]}) or build pcops from "
            f"source. {_REBUILD}")


def _op_names():
    """The names of the ops registered in the pcops namespace (without overload names)."""
    names = {n.split("::", 1)[1].split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("pcops::")}
    return sorted(names)


def install_call_hooks(C):
    """Puts pcops' call hook (C._wrap_op) in front of each op's Python entry points: the `_op`
    callable of its OpOverloadPacket and of each OpOverload, and each OpOverload's `redispatch`
    (which calls a kernel below a given key without `_op`: an instance attribute in front of the
    method, so that its errors are translated too). Runs once, right after the library
    is loaded and before anything else touches torch.ops.pcops (a packet hashes by its `_op`)."""
    get_mode = getattr(torch._C, "_cuda_get_sync_debug_mode", None)  # absent in CPU-only torch
    C._set_setting_readers(torch._C._get_deterministic_algorithms,
                           getattr(torch._C, "_get_deterministic_fill_uninitialized_memory", None))
    for name in _op_names():
        packet = getattr(torch.ops.pcops, name)
        sync = get_mode if name in _SYNCHRONISING else None
        if not hasattr(packet._op, "__wrapped__"):
            packet._op = C._wrap_op(packet._op, sync)
            # TorchScript resolves torch.ops.pcops.<name> through the packet's `_op`, by id in its
            # builtin table (torch/_ops.py registers the unwrapped one): register the hook too.
            torch.jit._builtins._register_builtin(packet._op, f"pcops::{name}")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not hasattr(op._op, "__wrapped__"):
                op._op = C._wrap_op(op._op, sync)
            if not hasattr(op.redispatch, "__wrapped__"):
                op.redispatch = C._wrap_op(op.redispatch, sync)


def load_library():
    try:
        build_info = importlib.import_module("pcops._build_info")
    except ImportError as e:
        raise ImportError(f"pcops is not built (pcops/_build_info.py is missing). {_REBUILD}") from e
    check_torch(build_info)
    try:
        C = importlib.import_module("pcops._C")
    except ImportError as e:
        raise ImportError(f"pcops._C could not be loaded ({e}). {_REBUILD}") from e
    install_call_hooks(C)
    return build_info
