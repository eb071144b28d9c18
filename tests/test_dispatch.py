"""The no-grad fast path of the wrappers (pcops/_dispatch.py) and FPS's C++ autograd fallthrough.

Every differentiable op has its derivatives in Python (an autograd.Function per op, applied by
the wrappers and installed as the op's Autograd kernel: pcops/_autograd.py), and entering that
Python machinery costs host time on every call. The wrappers skip it when no gradient or
tangent can flow. These tests check, for each wrapper, that
  * the outputs are the same bits whichever way the call went (inputs without grad, inputs with
    grad under torch.no_grad, inputs with grad), and require grad exactly when a gradient can
    flow (and the gradient then arrives);
  * the Python autograd code (a Function's setup_context, or the op's Autograd kernel) is
    entered only on the grad path: sys.setprofile records the Python functions a call enters,
    and the grad path must show it (so the check can fail);
  * FPS never enters it: its Autograd key falls through in C++ (as ball_query's, whose outputs
    are indices and counts).
"""
import sys

import pytest
import torch

import pcops
from pcops.compat import pointnet2_ops as p2, pytorch3d as p3d

from helpers import assert_equal, rand_points


def entered_autograd_kernel(fn):
    """(fn(), whether fn entered pcops's Python autograd code: a Function's setup_context or
    an op's Autograd kernel, pcops/_autograd.py)."""
    seen = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/pcops/" in path and (code.co_name == "setup_context" or (
                path.endswith("/_autograd.py") and code.co_name == "autograd_kernel")):
            seen.append(True)

    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, bool(seen)


def outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_paths(fn, make_inputs, grad_positions, diff_outputs):
    """fn(*inputs) three ways: no input requires grad; inputs require grad under no_grad; the
    grad path. grad_positions: the inputs that get requires_grad; diff_outputs: the positions
    of fn's outputs that are differentiable."""
    plain = make_inputs()
    ref, entered = entered_autograd_kernel(lambda: fn(*plain))
    assert not entered, "no input requires grad: the Python autograd kernel must be skipped"
    for o in outputs(ref):
        assert not o.requires_grad

    def with_grad():
        xs = [t.clone() for t in make_inputs()]
        for i in grad_positions:
            xs[i].requires_grad_(True)
        return xs

    xs = with_grad()
    with torch.no_grad():
        out, entered = entered_autograd_kernel(lambda: fn(*xs))
    assert not entered, "grad mode off: the Python autograd kernel must be skipped"
    for a, b in zip(outputs(out), outputs(ref)):
        assert_equal(a, b, what="no_grad output")
        assert not a.requires_grad

    xs = with_grad()
    out, entered = entered_autograd_kernel(lambda: fn(*xs))
    assert entered, "inputs require grad: the call must go through the op's autograd.Function"
    for j, (a, b) in enumerate(zip(outputs(out), outputs(ref))):
        assert_equal(a.detach(), b, what="grad-path output")
        assert a.requires_grad == (j in diff_outputs), j
    loss = sum(outputs(out)[j].double().nan_to_num(0.0, 0.0, 0.0).sum() for j in diff_outputs)
    loss.backward()
    assert any(xs[i].grad is not None for i in grad_positions)


@pytest.fixture
def clouds(device, gen):
    q = rand_points(2, 50, gen).to(device)
    r = rand_points(2, 80, gen).to(device)
    return q, r


def test_knn_paths(clouds):
    q, r = clouds
    check_paths(lambda a, b: pcops.knn(a, b, 5), lambda: [q, r], [0, 1], [0])
    check_paths(lambda a, b: pcops.knn(a[0], b[0], 5), lambda: [q, r], [0, 1], [0])  # 2-D
    check_paths(lambda a, b: pcops.three_nn(a, b), lambda: [q, r], [0, 1], [0])


def test_ball_query_dist2_paths(clouds):
    q, r = clouds
    check_paths(lambda a, b: pcops.ball_query_dist2(a, b, 0.3, 8), lambda: [q, r], [0, 1], [0])


def test_neighbor_dist2_paths(clouds):
    q, r = clouds
    idx = pcops.knn(q, r, 4)[1]
    check_paths(lambda a, b: pcops.neighbor_dist2(a, b, idx), lambda: [q, r], [0, 1], [0])


def test_group_interpolate_paths(device, gen):
    feats = torch.randn(2, 30, 6, generator=gen).to(device)
    idx = torch.randint(-1, 30, (2, 10, 4), generator=gen).to(device)
    w = torch.rand(2, 10, 4, generator=gen).to(device)
    check_paths(lambda f: pcops.group(f, idx), lambda: [feats], [0], [0])
    grad_out = torch.randn(2, 10, 4, 6, generator=gen).to(device)
    check_paths(lambda g: pcops.group_backward(g, idx, 30), lambda: [grad_out], [0], [0])
    check_paths(lambda f, ww: pcops.interpolate(f, idx, ww), lambda: [feats, w], [0, 1], [0])
    check_paths(lambda f, ww: pcops.three_interpolate(f, idx, ww), lambda: [feats, w], [0, 1],
                [0])


def test_compat_paths(device, gen, clouds):
    q, r = clouds
    feats = torch.randn(2, 6, 80, generator=gen).to(device)  # channels first
    idx3 = torch.randint(0, 80, (2, 50, 3), generator=gen).to(device).int()
    w = torch.rand(2, 50, 3, generator=gen).to(device)
    check_paths(lambda a, b: p3d.knn_points(a, b, K=4)[0], lambda: [q, r], [0, 1], [0])
    check_paths(lambda a, b: p3d.ball_query(a, b, K=6, radius=0.3)[0], lambda: [q, r], [0, 1],
                [0])
    nn_idx = pcops.knn(q, r, 4)[1]
    check_paths(lambda x: p3d.knn_gather(x, nn_idx), lambda: [r], [0], [0])
    check_paths(lambda x: p3d.masked_gather(x, nn_idx), lambda: [r], [0], [0])
    check_paths(lambda f: p2.grouping_operation(f, idx3), lambda: [feats], [0], [0])
    check_paths(lambda f: p2.gather_operation(f, idx3[:, :, 0].contiguous()), lambda: [feats],
                [0], [0])
    check_paths(lambda f, ww: p2.three_interpolate(f, idx3, ww), lambda: [feats, w], [0, 1], [0])


@pytest.mark.parametrize("direct", [False, True])
def test_fps_never_enters_python_autograd(device, gen, direct):
    xyz = rand_points(2, 64, gen).to(device)
    fn = ((lambda x: torch.ops.pcops.furthest_point_sample.default(x, 16, None, None)) if direct
          else (lambda x: pcops.furthest_point_sample(x, 16, return_dist2=True)))
    ref = fn(xyz)
    xg = xyz.clone().requires_grad_(True)
    out, entered = entered_autograd_kernel(lambda: fn(xg))
    assert not entered
    for a, b in zip(out, ref):
        assert_equal(a, b, what="fps output")
        assert not a.requires_grad
    forced = torch.ops.pcops._furthest_point_sample_path.default
    out, entered = entered_autograd_kernel(lambda: forced(xg, 16, None, None, 0))
    assert not entered and not out[1].requires_grad
    assert_equal(out[0], ref[0], what="forced-path idx")


def test_profile_hook_sees_the_kernel():
    """The detector itself: an op with a Python formula, called on an input that requires grad,
    is seen entering autograd_impl (else every 'skipped' assertion above would pass vacuously)."""
    x = torch.rand(1, 10, 3, requires_grad=True)
    _, entered = entered_autograd_kernel(lambda: torch.ops.pcops.knn.default(x, x, 2))
    assert entered


def test_ball_query_autograd_falls_through(device, gen):
    """ball_query's outputs are not differentiable: its Autograd key is a fallthrough (no autograd
    fallback kernel on the call), inputs with grad are accepted, the outputs do not require grad
    and hold the same bits."""
    is_fallthrough = torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough
    assert is_fallthrough("pcops::ball_query", "Autograd")
    assert not is_fallthrough("pcops::ball_query_dist2", "Autograd")  # its backward, in Python
    ref, query = rand_points(2, 200, gen).to(device), rand_points(2, 30, gen).to(device)
    idx, count = pcops.ball_query(query, ref, 0.3, 8, return_count=True)
    rg, qg = ref.clone().requires_grad_(True), query.clone().requires_grad_(True)
    idx2, count2 = pcops.ball_query(qg, rg, 0.3, 8, return_count=True)
    assert not idx2.requires_grad and not count2.requires_grad
    assert_equal(idx2, idx, what="ball_query idx with inputs that require grad")
    assert_equal(count2, count, what="ball_query count with inputs that require grad")
