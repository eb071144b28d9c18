"""pcops three_nn_pointnet2 (pointnet2_ops's three_nn in one op): bit for bit against knn +
sqrt + int32, against a float64 brute force, the padding of clouds with fewer than 3 known
points, every float dtype, non-contiguous inputs, opcheck, torch.compile, input checks, and
CPU against CUDA."""
import numpy as np
import pytest
import torch

import pcops
from helpers import FLOAT_DTYPES, assert_close, assert_equal, rand_points

op = torch.ops.pcops.three_nn_pointnet2.default
knn = torch.ops.pcops.knn.default
TOL = {torch.float32: 1e-6, torch.float64: 1e-14, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def three_nn_naive(unknown, known):
    """float64 brute force in pointnet2_ops's layout: the 3 nearest by (dist2, index), sqrt
    distances, int32 indices; slots past the known points hold index 0 and dist +inf."""
    u, k = unknown.detach().cpu().double(), known.detach().cpu().double()
    B, n, m = u.shape[0], u.shape[1], k.shape[1]
    dist = torch.full((B, n, 3), float("inf"), dtype=torch.float64)
    idx = torch.zeros(B, n, 3, dtype=torch.int32)
    for b in range(B):
        d2 = ((u[b, :, None, :] - k[b, None, :, :]) ** 2).sum(-1)  # [n, m]
        for i in range(n):
            order = sorted(range(m), key=lambda j: (float(d2[i, j]), j))[:3]
            for s, j in enumerate(order):
                dist[b, i, s] = d2[i, j].sqrt()
                idx[b, i, s] = j
    return dist, idx


def via_knn(unknown, known):
    """What the op replaces: knn (in the compute dtype: float32 for half types), sqrt, int32.
    The square root is numpy's (the hardware's, correctly rounded): torch's CPU float32 sqrt is
    not always (torch 2.15 on x86: 1 ulp off, e.g. sqrt(1.0179792642593384f))."""
    compute = torch.promote_types(unknown.dtype, torch.float32)
    d2, i = knn(unknown.detach().to(compute), known.detach().to(compute), 3)
    dist = torch.from_numpy(np.sqrt(d2.cpu().numpy())).to(unknown.dtype).to(d2.device)
    return dist, i.clamp(min=0).to(torch.int32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,n,m", [(2, 40, 1), (2, 40, 2), (2, 40, 3), (3, 50, 60),
                                   (1, 1, 7), (2, 0, 5), (0, 4, 5), (2, 6, 0)])
def test_matches_knn_and_float64_reference(device, gen, dtype, B, n, m):
    unknown = rand_points(B, n, gen, dtype=dtype, device=device)
    known = rand_points(B, m, gen, dtype=dtype, device=device)
    dist, idx = op(unknown, known)
    assert dist.shape == (B, n, 3) and idx.shape == (B, n, 3)
    assert dist.dtype == dtype and idx.dtype == torch.int32
    assert dist.device.type == device and idx.device.type == device
    rd, ri = via_knn(unknown, known)
    assert_equal(dist, rd, what="dist vs knn + sqrt")
    assert_equal(idx, ri, what="idx vs knn + int32")
    nd, ni = three_nn_naive(unknown, known)
    assert_close(dist, nd, atol=TOL[dtype], rtol=TOL[dtype] * 4, what="dist vs float64")
    if dtype in (torch.float32, torch.float64):  # half inputs round the points: other ties
        assert_equal(idx, ni, what="idx vs float64")
    # fewer than 3 known points: the missing slots are index 0, distance +inf
    if m < 3:
        assert (idx[..., m:] == 0).all() and torch.isinf(dist[..., m:]).all()
        assert torch.isfinite(dist[..., :m]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_known_points_bit_for_bit(device, gen, dtype):
    """Clouds large enough for the kNN's grid path (AUTO) give knn's bits too, and ties (repeated
    points) go to the lower index."""
    unknown = rand_points(2, 3000, gen, dtype=dtype, device=device)
    known = rand_points(2, 4096, gen, dtype=dtype, device=device)
    known[:, 100:200] = known[:, 0:100]  # exact duplicates: ties at every distance
    dist, idx = op(unknown, known)
    rd, ri = via_knn(unknown, known)
    assert_equal(dist, rd, what="dist")
    assert_equal(idx, ri, what="idx")


def test_sqrt_is_correctly_rounded(device):
    """dist is sqrt(dist2) correctly rounded, also for values whose float32 square root is a
    near tie (checked against float64 sqrt rounded to float32, exact for float32 inputs)."""
    g = torch.Generator().manual_seed(1)
    known = torch.rand(1, 2000, 3, generator=g, dtype=torch.float64).float().to(device)
    unknown = torch.zeros(1, 1, 3, device=device)
    dist, _ = op(unknown, known)
    d2, _ = knn(unknown, known, 3)
    assert_equal(dist, d2.double().sqrt().float(), what="sqrt rounding")


def test_non_contiguous_inputs(device, gen):
    u = rand_points(2, 30, gen, device=device)
    k = rand_points(2, 20, gen, device=device)
    u_nc = u.transpose(1, 2).contiguous().transpose(1, 2)  # [B, n, 3], channels-first storage
    k_nc = torch.cat([k, k], 1)[:, ::2]                    # strided rows
    assert not u_nc.is_contiguous() and not k_nc.is_contiguous()
    for a, b in zip(op(u_nc, k_nc), op(u, k_nc.contiguous())):
        assert_equal(a, b, what="non-contiguous")


def test_inputs_that_require_grad(device, gen):
    """Not differentiable (as pointnet2_ops's three_nn): inputs that require grad are accepted,
    the outputs carry no graph."""
    u = rand_points(2, 30, gen, device=device).requires_grad_()
    k = rand_points(2, 20, gen, device=device).requires_grad_()
    dist, idx = op(u, k)
    assert not dist.requires_grad and dist.grad_fn is None and not idx.requires_grad
    assert_equal(dist, op(u.detach(), k.detach())[0], what="dist")


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(device, gen, dtype, requires_grad):
    u = rand_points(2, 9, gen, dtype=dtype, device=device).requires_grad_(requires_grad)
    k = rand_points(2, 5, gen, dtype=dtype, device=device).requires_grad_(requires_grad)
    torch.library.opcheck(op, (u, k))
    torch.library.opcheck(op, (u, k[:, :2].detach().clone()))


def test_compiles(device, gen):
    u = rand_points(2, 30, gen, device=device)
    k = rand_points(2, 20, gen, device=device)
    fn = torch.compile(lambda a, b: op(a, b)[0] * 2.0, fullgraph=True)
    assert_equal(fn(u, k), op(u, k)[0] * 2.0, what="compiled")


def test_registered_with_its_schema():
    assert op._schema.name == "pcops::three_nn_pointnet2"
    assert [a.name for a in op._schema.arguments] == ["unknown", "known"]
    assert [r.name for r in op._schema.returns] == ["dist", "idx"]


def test_bad_inputs_raise_clear_errors(device, gen):
    u = rand_points(2, 6, gen, device=device)
    k = rand_points(2, 9, gen, device=device)
    cases = [
        ((u[0], k), ValueError, r"'unknown' must be a tensor of shape \[B, M, 3\]"),
        ((u[..., :2], k), ValueError, r"'unknown' must be a tensor of shape \[B, M, 3\]"),
        ((u, k[0]), ValueError, r"'known' must be a tensor of shape \[B, N, 3\]"),
        ((u, k.double()), TypeError, r"'known' must have the dtype of 'unknown'"),
        ((u.long(), k.long()), TypeError, r"'unknown' must be a floating point"),
        ((u, k[:1]), ValueError, r"'known' .*batch size B of 'unknown'"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=r"pcops\.three_nn_pointnet2: .*" + pattern):
            op(*args)


def test_mixed_devices_raise(cuda, gen):
    u, k = rand_points(2, 6, gen), rand_points(2, 9, gen)
    with pytest.raises(ValueError, match=r"pcops\.three_nn_pointnet2: .*'known' must be on the same device as 'unknown'"):
        op(u.cuda(), k)
    with pytest.raises(ValueError, match=r"pcops\.three_nn_pointnet2: .*'unknown' is .* while another argument is on CUDA"):
        op(u, k.cuda())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,n,m", [(2, 50, 2), (3, 200, 300), (2, 4096, 1024)])
def test_cpu_and_cuda_agree(cuda, gen, dtype, B, n, m):
    u = rand_points(B, n, gen, dtype=dtype)
    k = rand_points(B, m, gen, dtype=dtype)
    cpu = op(u, k)
    gpu = op(u.cuda(), k.cuda())
    assert_equal(gpu[0], cpu[0], what="dist CUDA vs CPU")
    assert_equal(gpu[1], cpu[1], what="idx CUDA vs CPU")


def test_cuda_graph_capture(cuda, gen):
    """No host synchronisation: captured, then replayed on new values."""
    u = rand_points(2, 500, gen, device="cuda")
    k = rand_points(2, 128, gen, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(u, k)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist, idx = op(u, k)
    u.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    rd, ri = op(u, k)
    assert_equal(dist, rd, what="replayed dist")
    assert_equal(idx, ri, what="replayed idx")


@pytest.mark.sanitizer
@pytest.mark.parametrize("B,n,m,dtype", [(2, 7, 1, torch.float32), (2, 33, 2, torch.float64),
                                         (3, 300, 257, torch.float32)])
def test_cuda_sanitizer_cases(cuda, gen, B, n, m, dtype):
    u = rand_points(B, n, gen, dtype=dtype)
    k = rand_points(B, m, gen, dtype=dtype)
    gpu = op(u.cuda(), k.cuda())
    cpu = op(u, k)
    assert_equal(gpu[0], cpu[0], what="dist")
    assert_equal(gpu[1], cpu[1], what="idx")
