"""The package itself: loading, the torch-range and CUDA-major errors, the op registry, the
wrappers' docs."""
import importlib
import types

import pytest
import torch

import pcops
from pcops import _loader

OPS = ["furthest_point_sample", "knn", "ball_query", "group", "group_backward", "circle_nms",
       "circle_nms_mask", "ball_query_dist2", "neighbor_edges", "three_nn_pointnet2",
       "_fps_layout"]


def test_every_op_is_registered_with_its_schema():
    for name in OPS:
        op = getattr(torch.ops.pcops, name).default
        assert op._schema.name == f"pcops::{name}"


def test_every_public_function_is_documented():
    for name in pcops.__all__:
        obj = getattr(pcops, name)
        if callable(obj):
            doc = obj.__doc__ or ""
            assert "Args:" in doc and "Example" in doc, f"pcops.{name} lacks Args/Example in its docstring"


def build(with_cuda=True, cuda_major=13):
    return types.SimpleNamespace(VERSION="0.1.0+cu13", TORCH_TARGET=(2, 10), WITH_CUDA=with_cuda,
                                 CUDA_MAJOR=cuda_major)


@pytest.mark.parametrize("version", ["2.10.0", "2.11.0+cu130", "2.15.0+cu132", "3.0.0"])
def test_every_torch_from_the_target_on_is_accepted(version):
    _loader.check_torch(build(), version, "13.0")
    _loader.check_torch(build(with_cuda=False, cuda_major=None), version, "")


def test_an_older_torch_raises_an_import_error_naming_the_supported_range():
    with pytest.raises(ImportError, match=r"supports torch >= 2\.10 .* but torch 2\.9\.1 is running"):
        _loader.check_torch(build(), "2.9.1", "13.0")


def test_another_cuda_major_raises_a_clear_import_error():
    with pytest.raises(ImportError, match=r"built for CUDA 13 .* torch 2\.11\.0\+cu128 uses CUDA 12\.8"):
        _loader.check_torch(build(), "2.11.0+cu128", "12.8")
    with pytest.raises(ImportError, match=r"holds CUDA 13 kernels, but torch 2\.11\.0\+cpu has no CUDA"):
        _loader.check_torch(build(), "2.11.0+cpu", None)


def test_the_running_torch_is_accepted():
    _loader.check_torch(pcops._build_info)


def test_missing_build_raises_a_clear_import_error(monkeypatch):
    real = importlib.import_module

    def fake_import(name, *args):
        if name == "pcops._build_info":
            raise ImportError("No module named 'pcops._build_info'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(ImportError, match=r"pcops is not built.*pip install --no-build-isolation"):
        _loader.load_library()
