"""The CPU kernels compute in IEEE arithmetic whatever the caller's floating-point mode: the same
bits on 1 and 2 threads, with flush-to-zero / denormals-are-zero on or off
(torch.set_flush_denormal), and on CUDA (which keeps denormals).

Inputs are scaled so that products and sums are denormal (squared distances near 1e-40 in
float32): under flush-to-zero they become 0, so a kernel that ran in the caller's mode, or in a
mix of modes across threads, would return other bits."""
import pytest
import torch

import pcops
from conftest import HAS_CUDA
from helpers import assert_equal
from pcops._paths import force

TINY = 1e-20  # float32 coordinates of this size have denormal squared differences


@pytest.fixture
def modes():
    """Runs fn in each (flush, threads) mode and returns the outputs; restores the caller's."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode")
    threads = torch.get_num_threads()

    def run(fn):
        out = {}
        for flush in (False, True):
            for n in (1, max(2, threads)):
                torch.set_num_threads(n)
                torch.set_flush_denormal(flush)
                try:
                    out[flush, n] = fn()
                finally:
                    torch.set_flush_denormal(False)
                    torch.set_num_threads(threads)
        return out
    return run


def check_same(outs, what):
    ref = outs[False, max(n for _, n in outs)]
    for (flush, n), got in outs.items():
        got = got if isinstance(got, tuple) else (got,)
        want = ref if isinstance(ref, tuple) else (ref,)
        for a, b in zip(got, want):
            assert_equal(a, b, what=f"{what}, flush-to-zero {flush}, {n} threads")
    return ref


def tiny_points(gen, *shape):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * TINY).float()


def test_flush_to_zero_is_real(modes):
    """The control: torch's own float32 arithmetic on these inputs does flush (else every test
    below would pass whatever the kernels do)."""
    x = torch.tensor([TINY], dtype=torch.float32)
    outs = modes(lambda: x * x)
    assert outs[False, 1].item() > 0 and outs[True, 1].item() == 0


@pytest.mark.parametrize("path", ["auto", "simple", "tree"])
def test_fps(modes, gen, path):
    x = tiny_points(gen, 8, 5000, 3)
    idx, dist2 = check_same(modes(lambda: force("furthest_point_sample", path, x, 64)), f"fps {path}")
    assert (dist2[:, 1:] > 0).all()  # denormal coverage radii, not flushed ones
    if HAS_CUDA:
        got = force("furthest_point_sample", "auto", x.cuda(), 64)
        assert_equal(got[0].cpu(), idx, what="fps CUDA idx")
        assert_equal(got[1].cpu(), dist2, what="fps CUDA dist2")


@pytest.mark.parametrize("path", ["brute", "grid"])
def test_knn(modes, gen, path):
    q, r = tiny_points(gen, 3, 300, 3), tiny_points(gen, 3, 2000, 3)
    dist2, idx = check_same(modes(lambda: force("knn", path, q, r, 8)), f"knn {path}")
    # denormal distances, not flushed ones (a few are exact zeros in IEEE arithmetic too: the
    # nearest refs can differ by less than sqrt of the smallest denormal in every coordinate)
    assert (dist2 > 0).float().mean() > 0.9
    if HAS_CUDA:
        got = pcops.knn(q.cuda(), r.cuda(), 8)
        assert_equal(got[1].cpu(), idx, what="knn CUDA idx")


@pytest.mark.parametrize("path", ["brute", "grid"])
def test_ball_query(modes, gen, path):
    """radius**2 itself is denormal in float32: under denormals-are-zero nothing would be within."""
    q, r = tiny_points(gen, 2, 200, 3), tiny_points(gen, 2, 1500, 3)
    radius = 0.1 * TINY
    idx, count = check_same(modes(lambda: force("ball_query", path, q, r, radius, 16)),
                            f"ball_query {path}")
    assert count.sum() > 0
    if HAS_CUDA:
        got = pcops.ball_query(q.cuda(), r.cuda(), radius, 16)
        assert_equal(got.cpu(), idx, what="ball_query CUDA idx")


def test_neighbor_dist2_and_three_nn(modes, gen):
    q, r = tiny_points(gen, 2, 100, 3), tiny_points(gen, 2, 400, 3)
    idx = pcops.knn(q, r, 5)[1]
    d = check_same(modes(lambda: pcops.neighbor_dist2(q, r, idx)), "neighbor_dist2")
    assert (d > 0).all()
    dist, i3 = check_same(modes(lambda: torch.ops.pcops.three_nn_pointnet2(q, r)), "three_nn_pointnet2")
    assert (dist > 0).all()


def test_interpolate_and_group_backward(modes, gen):
    feats = torch.rand(2, 50, 8, generator=gen)
    idx = torch.randint(0, 50, (2, 30, 3), generator=gen)
    weight = tiny_points(gen, 2, 30, 3) * TINY  # about 1e-40: denormal products
    out = check_same(modes(lambda: pcops.interpolate(feats, idx, weight)), "interpolate")
    assert (out != 0).any()
    grad = tiny_points(gen, 2, 30, 3, 8) * TINY
    g = check_same(modes(lambda: pcops.group_backward(grad, idx, 50)), "group_backward")
    assert (g != 0).any()


def test_circle_nms(modes, gen):
    c = tiny_points(gen, 3000, 2)
    s = torch.rand(3000, generator=gen)
    keep = check_same(modes(lambda: pcops.circle_nms(c, s, 0.05 * TINY)), "circle_nms")
    assert 1 < keep.numel() < 3000  # the radius removes some boxes, not all
