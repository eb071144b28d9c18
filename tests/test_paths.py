"""The path tables: the Python list (pcops/_paths.py) equals the C tables (kernels/<op>_paths.h,
read from the built library through pcops_path_table), and forcing a path follows one contract
for every op: a path of another device or dtype, or an unknown id, raises ValueError naming the
op and the path."""
import ctypes

import pytest
import torch

import pcops
from pcops._paths import PATHS, force, paths

ON_CPU, ON_CUDA = 1, 2
F32, F64 = 1, 2


class PathInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("name", ctypes.c_char_p), ("devices", ctypes.c_int),
                ("dtypes", ctypes.c_int)]


def c_table(op):
    lib = ctypes.CDLL(pcops._C.__file__)
    fn = lib.pcops_path_table
    fn.restype = ctypes.POINTER(PathInfo)
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    count = ctypes.c_int(-1)
    rows = fn(op.encode(), ctypes.byref(count))
    out = {}
    for i in range(count.value):
        r = rows[i]
        devices = tuple(d for d, bit in (("cpu", ON_CPU), ("cuda", ON_CUDA)) if r.devices & bit)
        dtypes = tuple(d for d, bit in (("float32", F32), ("float64", F64)) if r.dtypes & bit)
        out[r.name.decode()] = (r.id, devices, dtypes)
    return out


@pytest.mark.parametrize("op", sorted(PATHS))
def test_python_table_equals_c_table(op):
    c = c_table(op)
    assert list(c.items()) == list(PATHS[op].items())


def test_unknown_op_has_no_table():
    assert c_table("no_such_op") == {}
    assert set(PATHS) == {"furthest_point_sample", "knn", "ball_query", "circle_nms"}


@pytest.mark.parametrize("op", sorted(PATHS))
def test_ids_dense_from_auto(op):
    rows = list(PATHS[op].items())
    assert [i for _, (i, _, _) in rows] == list(range(len(rows)))
    assert rows[0] == ("auto", (0, ("cpu", "cuda"), ("float32", "float64")))
    for name, (_, devices, dtypes) in rows:
        assert name == name.lower() and devices and dtypes
    # every device has a path to force besides auto
    assert paths(op, "cpu") and paths(op, "cuda")


def _args(op, device, dtype=torch.float32):
    x = torch.rand(2, 40, 3, dtype=dtype, device=device)
    return {
        "furthest_point_sample": (x, 8),
        "knn": (x, x, 4),
        "ball_query": (x, x, 0.3, 4),
        "circle_nms": (x[0, :, :2], x[0, :, 2], 0.1),
    }[op]


@pytest.mark.parametrize("op", sorted(PATHS))
def test_forced_paths_agree_with_auto(op, device):
    """Every path of the device gives auto's bits on a small input (the ops' own test files
    cover the paths on hard inputs and at their size limits)."""
    for dtype in (torch.float32, torch.float64):
        args = _args(op, device, dtype)
        want = force(op, "auto", *args)
        for path in paths(op, device, dtype):
            try:
                got = force(op, path, *args)
            except ValueError as e:  # a path for other sizes says so, naming itself
                assert f"path '{path}' cannot take these inputs" in str(e)
                continue
            for a, b in zip(got, want):
                assert torch.equal(a, b), (op, path, dtype)


@pytest.mark.parametrize("op", sorted(PATHS))
def test_paths_of_another_device_raise(op, device):
    other = "cuda" if device == "cpu" else "cpu"
    where = "CUDA" if device == "cuda" else "the CPU"
    for path in set(paths(op, other)) - set(paths(op, device)):
        with pytest.raises(ValueError, match=rf"pcops\._{op}_path: path '{path}' does not run on {where}"):
            force(op, path, *_args(op, device))


@pytest.mark.parametrize("op", sorted(PATHS))
def test_bad_path_ids_raise(op, device):
    private = getattr(torch.ops.pcops, f"_{op}_path").default
    for bad in (-1, len(PATHS[op])):
        with pytest.raises(ValueError, match=rf"pcops\._{op}_path: argument 'path' must be a path id"):
            private(*_args(op, device), *([None] * (len(private._schema.arguments) - 1 - len(_args(op, device)))), bad)
    with pytest.raises(ValueError, match=f"no path 'nope' of op '{op}'"):
        force(op, "nope", *_args(op, device))


def test_public_schemas_have_no_path_argument():
    """Forcing is private: the public ops take no path (or variant) argument."""
    for op in ("furthest_point_sample", "knn", "ball_query", "circle_nms", "circle_nms_mask"):
        names = [a.name for a in getattr(torch.ops.pcops, op).default._schema.arguments]
        assert "path" not in names and "variant" not in names, (op, names)
