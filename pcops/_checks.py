"""Checks and messages that the bindings (bindings/utils.*) cannot give, worded like theirs.

* Devices in the fake (meta) implementations: a call whose tensors are on different devices,
  one of them ``meta``, is dispatched to the fake implementation (Meta is the dispatcher's
  highest backend key), not to the real kernel whose device checks would refuse it; so every
  fake checks devices as the bindings do, or it would return uninitialised tensors on the other
  device as if they were results (:func:`check_devices`).
* Arguments torch refuses before any pcops code runs: ints beyond int64 (:func:`argument_error`,
  on the wrappers' failure path), sparse / quantized / nested tensors (:func:`reject_other_layouts`,
  kernels for their dispatch keys), TorchScript (:func:`script_unsupported`).
"""
from typing import Optional

import torch
from torch import Tensor


def describe(t: Tensor) -> str:
    """"a 1-D int64 tensor of shape [2] on meta" (the bindings' describe())."""
    dtype = str(t.dtype).replace("torch.", "")
    return f"a {t.dim()}-D {dtype} tensor of shape {list(t.shape)} on {t.device}"


def check_devices(op: str, first_name: str, first: Tensor, **others: Optional[Tensor]) -> None:
    """Every tensor of ``others`` (None: an absent optional argument) is on ``first``'s device;
    otherwise a ValueError naming the op and the argument, as the bindings raise it."""
    device = first.device
    for name, t in others.items():
        if t is not None and t.device != device:
            raise ValueError(
                f"pcops.{op}: argument '{name}' must be on the same device as '{first_name}' "
                f"({device}), got {describe(t)}")


# ---- messages for what never reaches the bindings -------------------------------------------

_INT64 = range(-(1 << 63), 1 << 63)


def argument_error(op, args) -> Optional[Exception]:
    """After ``op(*args)`` (an OpOverload) failed in torch's argument conversion, before any
    pcops code ran: an error naming the op and the argument for what torch's message does not
    (a Python int beyond int64: "Expected a value of type 'int' ... found type 'int'"), or None
    to let the original error stand. Called only on the failure path (zero cost otherwise)."""
    name = op._schema.name.split("::")[1]
    for arg, value in zip(op._schema.arguments, args):
        if type(value) is not int:
            continue
        kind = str(arg.type)
        if kind in ("int", "SymInt") and value not in _INT64:
            return ValueError(
                f"pcops.{name}: argument '{arg.name}' must be an integer in int64's range "
                f"[-2**63, 2**63), got {_int(value)}")
        if kind == "float":
            try:
                float(value)
            except OverflowError:
                return ValueError(
                    f"pcops.{name}: argument '{arg.name}' must be a finite float, got "
                    f"{_int(value)}, beyond float64")
    return None


def _int(value: int) -> str:
    sign = "-" if value < 0 else ""
    if abs(value) < 1 << 128:
        return f"{value} (about {sign}2**{abs(value).bit_length() - 1})"
    return f"an integer of about {sign}2**{abs(value).bit_length() - 1}"


def _reject_layout(op_name: str):
    """A kernel for the dispatch keys of sparse, quantized, nested and MKL-DNN tensors: a
    TypeError naming the op and the first such argument, instead of the dispatcher's "Could not
    run 'pcops::<op>' with arguments from the 'SparseCPU' backend"."""
    op = getattr(torch.ops.pcops, op_name).default
    names = [a.name for a in op._schema.arguments]

    def kernel(*args, **kwargs):
        for name, t in zip(names, args):
            if isinstance(t, Tensor) and (t.layout != torch.strided or t.is_quantized
                                          or t.is_nested):
                if t.is_nested:  # no shape: its components have their own
                    got = f"a nested tensor of {t.size(0)} components"
                else:
                    kind = "quantized" if t.is_quantized else str(t.layout).replace("torch.", "")
                    got = f"a {kind} tensor of shape {list(t.shape)}"
                raise TypeError(
                    f"pcops.{op_name}: argument '{name}' must be a dense (strided) tensor, got "
                    f"{got} on {t.device}; convert it first (.to_dense(), .dequantize(), or "
                    "one call per nested component)")
        raise TypeError(f"pcops.{op_name}: all tensor arguments must be dense (strided) tensors")

    return kernel


_LAYOUT_KEYS = ("SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA", "QuantizedCPU",
                "QuantizedCUDA", "NestedTensorCPU", "NestedTensorCUDA", "MkldnnCPU")
_LIB = torch.library.Library("pcops", "IMPL")


def reject_other_layouts() -> None:
    """Registers :func:`_reject_layout` for every pcops op with a tensor argument: for the
    dispatch keys of the C++ layouts, and for the jagged nested tensors (a Python tensor
    subclass, whose own message would be "NotImplementedError: pcops.knn.default")."""
    try:
        from torch.nested._internal.nested_tensor import NestedTensor as jagged
    except ImportError:  # a torch without jagged nested tensors
        jagged = None
    names = sorted(n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                   if n.startswith("pcops::"))
    for op_name in names:
        op = getattr(torch.ops.pcops, op_name).default
        if not any("Tensor" in str(a.type) for a in op._schema.arguments):
            continue
        kernel = _reject_layout(op_name)
        for key in _LAYOUT_KEYS:
            _LIB.impl(op_name, kernel, key)
        if jagged is not None:
            torch.library.register_torch_dispatch(
                f"pcops::{op_name}", jagged, lambda mode, func, types, args, kwargs, k=kernel:
                k(*args, **kwargs), lib=_LIB)


def script_unsupported(fn, op: str) -> None:
    """Makes ``torch.jit.script`` of ``fn`` (directly, or of code that calls it) raise a message
    that says what to do, instead of failing inside ``fn``'s body (``*args``, keyword-only
    arguments). TorchScript is deprecated in torch; the ops stay scriptable as torch.ops.pcops.*."""
    fn.__script_unsupported = (
        f"pcops.{fn.__name__} is a Python function that TorchScript cannot compile "
        "(TorchScript is deprecated in PyTorch). Export with torch.export (it traces the pcops "
        "ops; AOTInductor runs them without Python) or compile with torch.compile; inside "
        f"TorchScript code call the op itself: torch.ops.pcops.{op}(...) (see the README, Ops).")
