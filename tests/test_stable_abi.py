"""The library on PyTorch's stable ABI: pcops' call hook in front of every op (ValueError /
TypeError from the bindings' message prefixes, bindings/module.cpp), the Autograd fallthroughs
registered from Python, and the library's load-time independence from Python (examples/aoti
dlopens it from C++)."""
import shutil
import subprocess

import pytest
import torch

import pcops
from pcops import _loader

# The ops whose outputs are not differentiable: their Autograd key falls through.
NO_AUTOGRAD = ["furthest_point_sample", "_furthest_point_sample_path", "ball_query",
               "_ball_query_path", "_knn_path", "circle_nms", "circle_nms_mask",
               "_circle_nms_path", "three_nn_pointnet2"]


def test_every_op_is_behind_the_call_hook():
    names = _loader._op_names()
    assert "knn" in names and "_set_debug_checks" in names
    for name in names:
        packet = getattr(torch.ops.pcops, name)
        assert type(packet._op).__name__ == "OpCall", name
        for overload in packet.overloads():
            assert type(getattr(packet, overload)._op).__name__ == "OpCall", (name, overload)


def test_value_and_type_errors_come_from_the_message_prefix():
    x = torch.rand(1, 5, 3)
    raw = torch.ops.pcops.knn.default._op.__wrapped__  # the op without the hook
    # below autograd: knn's Python Autograd kernel would call the op again, through the hook
    with torch._C._AutoDispatchBelowAutograd(), pytest.raises(
            RuntimeError, match=r"^ValueError: pcops\.knn: argument 'k' must be >= 1"):
        raw(x, x, 0)
    with pytest.raises(ValueError, match=r"^pcops\.knn: argument 'k' must be >= 1, got 0$"):
        torch.ops.pcops.knn.default(x, x, 0)
    with pytest.raises(ValueError, match=r"^pcops\.knn: argument 'k' must be >= 1"):
        torch.ops.pcops.knn(x, x, 0)  # the packet
    with pytest.raises(TypeError, match=r"^pcops\.knn: argument 'ref' must have the dtype of 'query'"):
        torch.ops.pcops.knn.default(x, x.double(), 2)


def test_other_errors_pass_unchanged():
    x = torch.rand(1, 5, 3)
    with pytest.raises(RuntimeError) as info:
        torch.ops.pcops.knn.default(x, x)  # no k: torch's own argument check
    assert not isinstance(info.value, (ValueError, TypeError))
    assert "k" in str(info.value)


def test_a_hooked_call_inside_another_restores_its_state():
    """group inside knn's Python autograd formula runs through the hook too; the outer call
    still finishes (the per-call state is saved and restored)."""
    q = torch.rand(2, 20, 3, requires_grad=True)
    r = torch.rand(2, 30, 3, requires_grad=True)
    dist2, _ = torch.ops.pcops.knn.default(q, r, 4)
    dist2.sum().backward()
    assert q.grad is not None and r.grad is not None


@pytest.mark.parametrize("name", NO_AUTOGRAD)
def test_autograd_falls_through(name):
    assert torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(f"pcops::{name}", "Autograd")


def aten_empty_calls(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::empty")


def test_outputs_are_filled_while_torch_fills_uninitialised_memory():
    """With torch.use_deterministic_algorithms and fill_uninitialized_memory (the tests'
    poison, conftest.py), the hook tells the bindings, which then take outputs from torch's
    empty (it fills them; the dispatcher records it); otherwise from the empty_strided shim."""
    x = torch.rand(1, 20, 3)
    assert torch.are_deterministic_algorithms_enabled()  # conftest's poison_outputs
    assert aten_empty_calls(lambda: pcops.knn(x, x, 3)) == 3  # dist2, idx and the CPU workspace (allocated also when empty)
    torch.use_deterministic_algorithms(False)
    assert aten_empty_calls(lambda: pcops.knn(x, x, 3)) == 0


def test_the_library_refers_to_no_data_symbol_of_python():
    """A C++ program without Python dlopens the library (RTLD_LAZY) to register the ops: the
    library may call Python functions only from Python, and must not need Python's data
    symbols (PyExc_*, Py_None...) at load time."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf")
    out = subprocess.run([readelf, "--relocs", "--wide", pcops._C.__file__], capture_output=True,
                         text=True, check=True).stdout
    eager = [line for line in out.splitlines()
             if ("GLOB_DAT" in line or "_COPY" in line or "R_X86_64_64" in line)
             and ("Py" in line.split()[-1] or "_Py" in line)]
    assert not eager, "\n".join(eager)
    dynamic = subprocess.run([readelf, "--dynamic", pcops._C.__file__], capture_output=True,
                             text=True, check=True).stdout
    assert "BIND_NOW" not in dynamic and " NOW" not in dynamic, "the library asks for eager binding"
