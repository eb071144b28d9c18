"""The package itself: loading, the build-mismatch error, the op registry, the wrappers' docs."""
import importlib

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


@pytest.mark.parametrize("field,value", [("TORCH_VERSION", "1.0.0"), ("TORCH_CUDA_VERSION", "9.9")])
def test_build_mismatch_raises_a_clear_import_error(monkeypatch, field, value):
    info = importlib.import_module("pcops._build_info")
    monkeypatch.setattr(info, field, value)
    with pytest.raises(ImportError, match=r"pcops was built against torch .* but torch .* is running.*Rebuild"):
        _loader.load_library()


def test_missing_build_raises_a_clear_import_error(monkeypatch):
    real = importlib.import_module

    def fake_import(name, *args):
        if name == "pcops._build_info":
            raise ImportError("No module named 'pcops._build_info'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(ImportError, match=r"pcops is not built.*pip install --no-build-isolation"):
        _loader.load_library()
