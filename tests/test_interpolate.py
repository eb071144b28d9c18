"""pcops.interpolate / three_interpolate / three_nn: the weighted gather of PointNet++ feature
propagation, against a float64 brute force, with its deterministic backward and opcheck."""
import pytest
import torch

import pcops
from helpers import FLOAT_DTYPES, assert_close, assert_equal, rand_points

TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def interpolate_naive(features, idx, weight):
    """float64 loop over (b, m, k): out[b,m] = sum of weight * features[b, idx] over idx >= 0."""
    f, w = features.detach().cpu().double(), weight.detach().cpu().double()
    idx = idx.cpu()
    B, M, K = idx.shape
    out = torch.zeros(B, M, f.shape[2], dtype=torch.float64)
    for b in range(B):
        for m in range(M):
            for k in range(K):
                n = int(idx[b, m, k])
                if n >= 0:
                    out[b, m] += w[b, m, k] * f[b, n]
    return out


def random_case(B, N, M, K, C, gen, dtype=torch.float32, device="cpu", holes=True):
    features = torch.randn(B, N, C, generator=gen, dtype=torch.float64).to(dtype).to(device)
    idx = torch.randint(0, max(N, 1), (B, M, K), generator=gen)
    if holes or N == 0:
        idx[torch.rand(B, M, K, generator=gen) < 0.2] = -1
    if N == 0:
        idx.fill_(-1)
    weight = torch.rand(B, M, K, generator=gen, dtype=torch.float64).to(dtype).to(device)
    return features, idx.to(device), weight


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,N,M,K,C", [(2, 50, 70, 3, 16), (1, 1, 5, 3, 1), (3, 9, 4, 1, 7),
                                        (2, 33, 300, 5, 130), (2, 0, 6, 3, 4), (1, 8, 0, 3, 4)])
def test_matches_float64_reference(device, gen, dtype, B, N, M, K, C):
    features, idx, weight = random_case(B, N, M, K, C, gen, dtype, device)
    out = pcops.interpolate(features, idx, weight)
    assert out.shape == (B, M, C) and out.dtype == dtype and out.device.type == device
    ref = interpolate_naive(features, idx, weight)
    assert_close(out, ref, atol=TOL[dtype] * 3, rtol=TOL[dtype], what="interpolate")


def test_summation_order_is_ascending_k_in_float32(gen):
    """The kernel adds the rounded products in ascending k from 0: emulate that in float32 and
    ask for the same bits (this is what makes CPU and CUDA agree bit for bit)."""
    features, idx, weight = random_case(2, 40, 60, 3, 20, gen)
    out = pcops.interpolate(features, idx, weight)
    exp = torch.zeros(2, 60, 20)
    for k in range(3):
        g = pcops.group(features, idx[:, :, k:k + 1]).squeeze(2)
        exp = exp + torch.where(idx[:, :, k:k + 1] >= 0, weight[:, :, k:k + 1] * g, 0.0)
    assert_equal(out, exp, what="interpolate vs ordered float32 sum")


def test_non_contiguous_inputs(device, gen):
    features, idx, weight = random_case(2, 30, 20, 3, 8, gen, device=device)
    f_t = features.transpose(1, 2).contiguous().transpose(1, 2)  # [B,N,C] view, strides swapped
    w_t = weight.transpose(1, 2).contiguous().transpose(1, 2)
    assert not f_t.is_contiguous() and not w_t.is_contiguous()
    assert_equal(pcops.interpolate(f_t, idx, w_t), pcops.interpolate(features, idx, weight))


def test_three_interpolate_is_interpolate(gen):
    features, idx, weight = random_case(2, 30, 20, 3, 8, gen)
    assert_equal(pcops.three_interpolate(features, idx, weight),
                 pcops.interpolate(features, idx, weight))


def test_gradcheck_float64(device, gen):
    features, idx, weight = random_case(2, 7, 5, 3, 4, gen, torch.float64, device)
    idx[0, 0] = torch.tensor([2, 2, 2])  # one point taken three times by one row
    features.requires_grad_(True)
    weight.requires_grad_(True)
    assert torch.autograd.gradcheck(pcops.interpolate, (features, idx, weight))
    assert torch.autograd.gradgradcheck(pcops.interpolate, (features, idx, weight))


def test_backward_matches_reference_and_is_deterministic(device, gen):
    features, idx, weight = random_case(2, 20, 200, 3, 32, gen, device=device)
    features.requires_grad_(True)
    weight.requires_grad_(True)
    grad = torch.randn(2, 200, 32, generator=gen).to(device)
    grads = []
    for _ in range(3):
        gf, gw = torch.autograd.grad(pcops.interpolate(features, idx, weight), (features, weight),
                                     grad)
        grads.append((gf, gw))
    for gf, gw in grads[1:]:
        assert_equal(gf, grads[0][0], what="grad features, run to run")
        assert_equal(gw, grads[0][1], what="grad weight, run to run")
    f64 = features.detach().double().cpu().requires_grad_(True)
    w64 = weight.detach().double().cpu().requires_grad_(True)
    ref = torch.zeros(2, 200, 32, dtype=torch.float64)
    for k in range(3):  # the same sum written with torch.gather, differentiable
        sel = idx[:, :, k].cpu().clamp(min=0)
        g = torch.gather(f64, 1, sel[..., None].expand(-1, -1, 32))
        ref = ref + torch.where(idx[:, :, k:k + 1].cpu() >= 0, w64[:, :, k:k + 1] * g, 0.0)
    rf, rw = torch.autograd.grad(ref, (f64, w64), grad.double().cpu())
    assert_close(grads[0][0], rf, atol=1e-4, rtol=1e-5, what="grad features")
    assert_close(grads[0][1], rw, atol=1e-4, rtol=1e-5, what="grad weight")


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_opcheck(device, gen, requires_grad, dtype):
    features, idx, weight = random_case(2, 9, 6, 3, 5, gen, dtype, device)
    features.requires_grad_(requires_grad)
    weight.requires_grad_(requires_grad)
    torch.library.opcheck(torch.ops.pcops.interpolate.default, (features, idx, weight))


def test_bad_inputs_raise_clear_errors(gen):
    features, idx, weight = random_case(2, 9, 6, 3, 5, gen)
    with pytest.raises(TypeError, match=r"pcops.interpolate: argument 'weight' must have the dtype"):
        pcops.interpolate(features, idx, weight.double())
    with pytest.raises(TypeError, match=r"pcops.interpolate: argument 'idx' must be an int64 or int32 tensor, got a 3-D Short"):
        pcops.interpolate(features, idx.short(), weight)
    with pytest.raises(TypeError, match=r"pcops.interpolate: argument 'idx' must be an int64 or int32 tensor, got a 3-D Float"):
        pcops.interpolate(features, idx.float(), weight)
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'idx' must hold values in \[-1, N\)"):
        pcops.interpolate(features, (idx + 9).int(), weight)
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'idx'"):
        pcops.interpolate(features, idx[:1].int(), weight[:1])
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'weight'"):
        pcops.interpolate(features, idx, weight[:, :, :2])
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'idx' must hold values in \[-1, N\)"):
        pcops.interpolate(features, idx + 9, weight)
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'features'"):
        pcops.interpolate(features[0], idx, weight)
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'idx'"):
        pcops.interpolate(features, idx[:1], weight[:1])
    # an output that cannot fit in memory: named before any allocation or value check (the
    # expanded inputs are views that cost nothing and must not be read)
    big_idx = torch.zeros(1, 1, 1, dtype=torch.long).expand(1, 2**33, 3)
    big_w = torch.zeros(1, 1, 1).expand(1, 2**33, 3)
    with pytest.raises(ValueError, match=r"pcops.interpolate: argument 'idx' asks for an output of shape \[1, 8589934592, 4096\]"):
        pcops.interpolate(torch.zeros(1, 4, 4096), big_idx, big_w)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_cpu_and_cuda_give_the_same_bits(cuda, gen, idx_dtype):
    features, idx, weight = random_case(3, 500, 2000, 3, 67, gen)
    idx = idx.to(idx_dtype)
    for dtype in (torch.float32, torch.float64):
        f, w = features.to(dtype), weight.to(dtype)
        cpu = pcops.interpolate(f, idx, w)
        gpu = pcops.interpolate(f.cuda(), idx.cuda(), w.cuda())
        assert_equal(gpu, cpu, what=f"CUDA vs CPU {dtype}, idx {idx_dtype}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_int32_idx_is_read_as_is(device, gen, dtype):
    """int32 indices (pointnet2_ops's) give the int64 results bit for bit, forward and both
    gradients, and match the float64 reference."""
    features, idx, weight = random_case(2, 40, 90, 3, 24, gen, dtype, device)
    idx32 = idx.int()
    out = pcops.interpolate(features, idx32, weight)
    assert out.dtype == dtype and out.shape == (2, 90, 24)
    assert_equal(out, pcops.interpolate(features, idx, weight), what="int32 vs int64 forward")
    assert_close(out, interpolate_naive(features, idx, weight), atol=TOL[dtype] * 3,
                 rtol=TOL[dtype], what="int32 forward vs reference")
    f = features.detach().requires_grad_(True)
    w = weight.detach().requires_grad_(True)
    grad = torch.randn(2, 90, 24, generator=gen).to(dtype).to(device)
    g32 = torch.autograd.grad(pcops.interpolate(f, idx32, w), (f, w), grad)
    g64 = torch.autograd.grad(pcops.interpolate(f, idx, w), (f, w), grad)
    assert_equal(g32[0], g64[0], what="int32 vs int64 grad features")
    assert_equal(g32[1], g64[1], what="int32 vs int64 grad weight")


def test_gradcheck_float64_int32_idx(device, gen):
    features, idx, weight = random_case(2, 7, 5, 3, 4, gen, torch.float64, device)
    idx[0, 0] = torch.tensor([2, 2, 2])
    features.requires_grad_(True)
    weight.requires_grad_(True)
    assert torch.autograd.gradcheck(pcops.interpolate, (features, idx.int(), weight))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_opcheck_int32_idx(device, gen, requires_grad, dtype):
    features, idx, weight = random_case(2, 9, 6, 3, 5, gen, dtype, device)
    features.requires_grad_(requires_grad)
    weight.requires_grad_(requires_grad)
    torch.library.opcheck(torch.ops.pcops.interpolate.default, (features, idx.int(), weight))


def test_three_nn_is_knn_of_three(device, gen):
    unknown = rand_points(2, 100, gen, device=device)
    known = rand_points(2, 30, gen, device=device)
    dist2, idx = pcops.three_nn(unknown, known)
    ref = ((unknown.double()[:, :, None] - known.double()[:, None]) ** 2).sum(-1)
    rd, ri = ref.topk(3, dim=-1, largest=False)
    assert_equal(idx, ri.to(device), what="three_nn idx")
    assert_close(dist2, rd, atol=1e-6, rtol=1e-5, what="three_nn dist2")
    # fewer than three known points: -1 / +inf, and those slots add nothing when interpolated
    d2, i2 = pcops.three_nn(unknown, known[:, :2])
    assert (i2[..., 2] == -1).all() and torch.isinf(d2[..., 2]).all()
    feats = torch.randn(2, 2, 4, generator=gen).to(device)
    w = torch.ones_like(d2)
    assert_close(pcops.three_interpolate(feats, i2, w), feats.sum(1, keepdim=True).expand(2, 100, 4),
                 atol=1e-6, what="interpolation with a -1 slot")


def test_registered_with_its_schema():
    op = torch.ops.pcops.interpolate.default
    assert op._schema.name == "pcops::interpolate"
    assert [a.name for a in op._schema.arguments] == ["features", "idx", "weight"]


def test_cuda_graph_capture(cuda, gen):
    """No host synchronisation on CUDA: the op can be captured and replayed on new values."""
    features, idx, weight = random_case(2, 50, 70, 3, 16, gen, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pcops.interpolate(features, idx, weight)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pcops.interpolate(features, idx, weight)
    features.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert_equal(out, pcops.interpolate(features, idx, weight), what="replayed graph")
