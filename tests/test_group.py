"""group and group_backward: against independent references, bitwise determinism, autograd,
every dtype, odd sizes and alignments, empty tensors, bad inputs, and CUDA (streams, graphs,
torch.compile)."""
import pytest
import torch

import pcops
from helpers import FLOAT_DTYPES, assert_close, assert_equal

group_op = torch.ops.pcops.group.default
backward_op = torch.ops.pcops.group_backward.default


# ---------------------------------------------------------------------------------------------
# inputs and references


def rand_idx(B, M, S, N, gen, *, empty=0.15, low=0, high=None, device="cpu"):
    """int64 [B, M, S] in [low, high) (default [0, N)), about `empty` of the slots -1."""
    high = N if high is None else high
    if N == 0 or high <= low:
        return torch.full((B, M, S), -1, dtype=torch.long, device=device)
    idx = torch.randint(low, high, (B, M, S), generator=gen)
    idx[torch.rand(B, M, S, generator=gen) < empty] = -1
    return idx.to(device)


def rand_features(B, N, C, gen, *, dtype=torch.float32, device="cpu"):
    return torch.randn(B, N, C, generator=gen, dtype=torch.float64).to(dtype).to(device)


def group_reference(features, idx):
    """features[b, idx[b, m, s], :] by advanced indexing, with -1 reading a row of zeros
    appended past the last point (an exact copy in any dtype)."""
    features, idx = features.cpu(), idx.cpu()
    B, N, C = features.shape
    padded = torch.cat([features, features.new_zeros(B, 1, C)], dim=1)
    rows = torch.where(idx < 0, torch.full_like(idx, N), idx)
    return padded[torch.arange(B)[:, None, None], rows]


def group_backward_ordered(grad_out, idx, N):
    """The contract's sum for each point, in grad_out's dtype (float32 or float64): the rows
    with idx == n added in ascending (m, s) order, starting from 0. Vectorised over points:
    step r adds the r-th row of every point (a point appears at most once per step)."""
    grad_out, idx = grad_out.cpu(), idx.cpu()
    B, M, S, C = grad_out.shape
    out = torch.zeros(B, N, C, dtype=grad_out.dtype)
    for b in range(B):
        ids = idx[b].reshape(-1)
        rows = grad_out[b].reshape(-1, C)
        pos = torch.nonzero((ids >= 0) & (ids < N)).flatten()  # ascending (m, s)
        n = ids[pos]
        order = torch.argsort(n, stable=True)  # keeps ascending (m, s) within a point
        pos, n = pos[order], n[order]
        rank = torch.arange(len(n)) - torch.searchsorted(n, n)  # position within the point
        for r in range(int(rank.max()) + 1 if len(n) else 0):
            sel = rank == r
            out[b, n[sel]] = out[b, n[sel]] + rows[pos[sel]]
    return out


def group_backward_float64(grad_out, idx, N):
    """The float64 sum by index_add_ (order-free ground truth for tolerance checks)."""
    grad_out, idx = grad_out.cpu().double(), idx.cpu()
    B, M, S, C = grad_out.shape
    out = torch.zeros(B, N + 1, C, dtype=torch.float64)
    rows = torch.where((idx < 0) | (idx >= N), torch.full_like(idx, N), idx)
    for b in range(B):
        out[b].index_add_(0, rows[b].reshape(-1), grad_out[b].reshape(-1, C))
    return out[:, :N]


def expected_backward(grad_out, idx, N):
    """What group_backward must return bitwise: the ordered sum in float32 for half types
    (then rounded once) and in the dtype itself for float32/float64."""
    dtype = grad_out.dtype
    work = grad_out if dtype in (torch.float32, torch.float64) else grad_out.float()
    return group_backward_ordered(work, idx, N).to(dtype)


SIZES = [  # B, N, C, M, S
    (1, 1, 1, 1, 1),
    (1, 2, 3, 1, 5),
    (2, 3, 5, 4, 3),
    (3, 7, 8, 5, 7),
    (2, 8, 2, 8, 8),
    (4, 33, 16, 9, 4),
    (2, 100, 33, 17, 16),
    (3, 257, 64, 31, 32),
    (1, 1000, 300, 64, 16),  # C past the CPU's channel chunk, one cloud (point-range tasks)
    (5, 513, 6, 128, 9),
]


# ---------------------------------------------------------------------------------------------
# forward


@pytest.mark.parametrize("B,N,C,M,S", SIZES)
def test_group_matches_reference(device, gen, B, N, C, M, S):
    features = rand_features(B, N, C, gen)
    idx = rand_idx(B, M, S, N, gen)
    out = group_op(features.to(device), idx.to(device))
    assert out.shape == (B, M, S, C) and out.dtype == features.dtype
    assert_equal(out, group_reference(features, idx), what="group")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("C", [1, 2, 3, 4, 6, 8, 12, 16, 24, 40])
def test_group_every_dtype_is_an_exact_copy(device, gen, dtype, C):
    # C * element size hits every vector width of the CUDA copy (2, 4, 8 and 16 bytes)
    features = rand_features(3, 50, C, gen, dtype=dtype)
    idx = rand_idx(3, 20, 7, 50, gen)
    out = group_op(features.to(device), idx.to(device))
    assert out.dtype == dtype
    assert_equal(out, group_reference(features, idx), what=f"group {dtype} C={C}")


def test_group_special_values_are_copied_bit_for_bit(device):
    bits = torch.tensor([0x7FC00001, 0xFF800000, 0x80000000, 0x00000001, 0x7F7FFFFF], dtype=torch.int64)
    features = bits.to(torch.int32).view(torch.float32).reshape(1, 5, 1)  # NaN payload, -inf, -0, denormal, max
    idx = torch.tensor([[[4, 3, 2, 1, 0, -1]]])
    out = group_op(features.to(device), idx.to(device)).cpu()
    got = out.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert got.tolist() == [0x7F7FFFFF, 0x00000001, 0x80000000, 0xFF800000, 0x7FC00001, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_int32_idx_is_read_as_is(device, gen, dtype):
    """int32 indices (pointnet2_ops's) give the int64 results bit for bit, forward and
    backward, against the float64 references; the int32 tensor is not converted."""
    B, N, C, M, S = 3, 50, 7, 11, 6
    features = rand_features(B, N, C, gen, dtype=dtype).to(device)
    idx = rand_idx(B, M, S, N, gen, device=device)
    idx32 = idx.int()
    out = group_op(features, idx32)
    assert_equal(out, group_reference(features, idx), what="int32 forward vs reference")
    assert_equal(out, group_op(features, idx), what="int32 vs int64 forward")
    grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype).to(device)
    got = backward_op(grad_out, idx32, N)
    assert_equal(got, backward_op(grad_out, idx, N), what="int32 vs int64 backward")
    assert_equal(got, expected_backward(grad_out, idx, N), what="int32 backward vs ordered sum")
    f = features.double().requires_grad_()
    (g,) = torch.autograd.grad(group_op(f, idx32), f, grad_out.double())
    assert_close(g, group_backward_float64(grad_out.double(), idx, N), atol=1e-12,
                 what="int32 autograd vs float64")


def test_group_minus_one_and_repeats(device, gen):
    features = rand_features(2, 6, 4, gen).to(device)
    idx = torch.tensor([[[-1, -1, -1], [5, 5, 5]], [[0, -1, 0], [3, 2, 1]]], device=device)
    out = group_op(features, idx)
    assert (out[0, 0] == 0).all()
    assert_equal(out[0, 1], features[0, 5].expand(3, 4))
    assert_equal(out[1, 0, 1], torch.zeros(4))
    assert_equal(out[1, 1], features[1, [3, 2, 1]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_group_misaligned_and_non_contiguous_inputs(device, gen, dtype):
    B, N, C, M, S = 2, 40, 8, 10, 6
    # contiguous views that start one element into their storage: not 16-byte aligned
    flat = rand_features(1, 1, B * N * C + 1, gen, dtype=dtype).flatten().to(device)
    features = flat[1:].view(B, N, C)
    assert features.is_contiguous() and features.data_ptr() % 16 != 0
    idx = rand_idx(B, M, S, N, gen, device=device)
    assert_equal(group_op(features, idx), group_reference(features, idx))
    # strided in every dimension
    big = rand_features(2 * B, N, 2 * C, gen, dtype=dtype).to(device)
    features = big.transpose(0, 1).contiguous().transpose(0, 1)[::2, :, ::2]
    idx = rand_idx(B, M, 2 * S, N, gen, device=device)[:, :, ::2]
    assert not features.is_contiguous() and not idx.is_contiguous()
    assert_equal(group_op(features, idx), group_reference(features, idx))


@pytest.mark.parametrize("B,N,C,M,S", [(0, 5, 3, 4, 2), (2, 0, 3, 4, 2), (2, 5, 0, 4, 2),
                                       (2, 5, 3, 0, 2), (2, 5, 3, 4, 0), (0, 0, 0, 0, 0)])
def test_group_empty_tensors(device, B, N, C, M, S):
    features = torch.randn(B, N, C, device=device)
    idx = torch.full((B, M, S), -1, dtype=torch.long, device=device)
    out = group_op(features, idx)
    assert out.shape == (B, M, S, C)
    assert (out == 0).all()
    grad = backward_op(torch.randn(B, M, S, C, device=device), idx, N)
    assert grad.shape == (B, N, C)
    assert (grad == 0).all()


def test_wrappers_call_the_ops(gen):
    features = rand_features(2, 10, 3, gen)
    idx = rand_idx(2, 4, 5, 10, gen)
    assert_equal(pcops.group(features, idx), group_op(features, idx))
    g = torch.randn(2, 4, 5, 3, generator=gen)
    assert_equal(pcops.group_backward(g, idx, 10), backward_op(g, idx, 10))


# ---------------------------------------------------------------------------------------------
# backward


@pytest.mark.parametrize("B,N,C,M,S", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_is_the_ordered_sum_bitwise(device, gen, B, N, C, M, S, dtype):
    grad_out = torch.randn(B, M, S, C, generator=gen, dtype=dtype)
    idx = rand_idx(B, M, S, N, gen)
    got = backward_op(grad_out.to(device), idx.to(device), N)
    assert got.shape == (B, N, C) and got.dtype == dtype
    assert_equal(got, group_backward_ordered(grad_out, idx, N), what="ordered sum")
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert_close(got, group_backward_float64(grad_out, idx, N), atol=tol, rtol=tol, what="float64 sum")


@pytest.mark.parametrize("case", ["one_point", "few_points", "half_empty", "all_empty"])
def test_backward_heavy_repeats(device, gen, case):
    """Many slots on the same points (ball-query padding repeats the first neighbour): long
    segments, where the order of the additions shows in float32."""
    B, N, C, M, S = 2, 50, 19, 64, 32
    if case == "one_point":
        idx = torch.full((B, M, S), 7, dtype=torch.long)
    elif case == "few_points":
        idx = rand_idx(B, M, S, N, gen, high=3)
    elif case == "half_empty":
        idx = rand_idx(B, M, S, N, gen, empty=0.5)
    else:
        idx = torch.full((B, M, S), -1, dtype=torch.long)
    grad_out = torch.randn(B, M, S, C, generator=gen) * torch.logspace(-4, 4, S)[:, None]  # order-sensitive
    got = backward_op(grad_out.to(device), idx.to(device), N)
    assert_equal(got, group_backward_ordered(grad_out, idx, N))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_half_types_accumulate_in_float32(device, gen, dtype):
    B, N, C, M, S = 2, 30, 24, 40, 16
    grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype)
    idx = rand_idx(B, M, S, N, gen, high=6)  # long segments: a float16 accumulator would differ
    got = backward_op(grad_out.to(device), idx.to(device), N)
    assert got.dtype == dtype
    assert_equal(got, expected_backward(grad_out, idx, N), what=f"{dtype} backward")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_reads_every_half_bit_pattern_exactly(device, dtype):
    """All 65536 bit patterns (subnormals, infinities, NaNs, -0), one per point: each sum is
    0 + x, so the result is x itself (-0 becomes +0) if the conversion to float32 is exact."""
    grad_out = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).view(1, -1, 1, 1)
    idx = torch.arange(2**16).view(1, -1, 1)
    got = backward_op(grad_out.to(device), idx.to(device), 2**16)
    assert_equal(got, expected_backward(grad_out, idx, 2**16))
    finite = grad_out.flatten().float().isfinite()
    assert_equal(got.flatten()[finite], (grad_out.flatten()[finite].float() + 0.0).to(dtype))


def test_backward_is_bitwise_reproducible(device, gen):
    B, N, C, M, S = 4, 200, 32, 128, 32
    features = rand_features(B, N, C, gen).to(device).requires_grad_()
    idx = rand_idx(B, M, S, N, gen, high=40, device=device)
    weight = torch.randn(B, M, S, C, generator=gen).to(device)
    grads = []
    for _ in range(3):
        features.grad = None
        (group_op(features, idx) * weight).sum().backward()
        grads.append(features.grad.clone())
    for g in grads[1:]:
        assert torch.equal(g.view(torch.int32), grads[0].view(torch.int32)), "backward bits changed between runs"
    assert_equal(grads[0], group_backward_ordered(weight, idx, N))


def test_autograd_of_group_is_group_backward(device, gen):
    features = rand_features(2, 20, 5, gen).to(device).requires_grad_()
    idx = rand_idx(2, 6, 4, 20, gen, device=device)
    weight = torch.randn(2, 6, 4, 5, generator=gen).to(device)
    (grad,) = torch.autograd.grad((group_op(features, idx) * weight).sum(), features)
    assert_equal(grad, backward_op(weight, idx, 20))


def test_double_backward_is_group(device, gen):
    features = rand_features(2, 20, 5, gen).to(device).requires_grad_()
    idx = rand_idx(2, 6, 4, 20, gen, device=device)
    grad_out = torch.randn(2, 6, 4, 5, generator=gen).to(device).requires_grad_()
    out = group_op(features, idx)
    (gf,) = torch.autograd.grad(out, features, grad_out, create_graph=True)
    v = torch.randn(2, 20, 5, generator=gen).to(device)
    (ggo,) = torch.autograd.grad(gf, grad_out, v)
    assert_equal(ggo, group_op(v, idx))


@pytest.mark.parametrize("with_empty", [False, True])
def test_gradcheck_float64(device, gen, with_empty):
    features = rand_features(2, 6, 3, gen, dtype=torch.float64).to(device).requires_grad_()
    idx = rand_idx(2, 4, 3, 6, gen, empty=0.3 if with_empty else 0.0, device=device)
    assert torch.autograd.gradcheck(group_op, (features, idx))
    assert torch.autograd.gradgradcheck(group_op, (features, idx))
    grad_out = torch.randn(2, 4, 3, 3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda g: backward_op(g, idx, 6), (grad_out,))
    assert torch.autograd.gradgradcheck(lambda g: backward_op(g, idx, 6), (grad_out,))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_opcheck(device, gen, requires_grad, dtype, idx_dtype):
    features = rand_features(2, 9, 4, gen, dtype=dtype).to(device).requires_grad_(requires_grad)
    idx = rand_idx(2, 5, 3, 9, gen, device=device).to(idx_dtype)
    torch.library.opcheck(group_op, (features, idx))
    grad_out = torch.randn(2, 5, 3, 4, generator=gen).to(dtype).to(device).requires_grad_(requires_grad)
    torch.library.opcheck(backward_op, (grad_out, idx, 9))
    torch.library.opcheck(backward_op, (grad_out, idx, 12))  # more points than referenced


# ---------------------------------------------------------------------------------------------
# bad inputs: each raises a Python exception naming the op and the argument


def _group_bad_cases(device):
    f = torch.rand(2, 10, 4, device=device)
    i = torch.zeros(2, 3, 5, dtype=torch.long, device=device)
    cases = [
        ((torch.rand(10, 4, device=device), i), ValueError, r"'features' must be a tensor of shape \[B, N, C\], got a 2-D"),
        ((torch.ones(2, 10, 4, dtype=torch.int32, device=device), i), TypeError, r"'features' must be a floating point"),
        ((torch.ones(2, 10, 4, dtype=torch.bool, device=device), i), TypeError, r"'features' must be a floating point"),
        ((f, i.float()), TypeError, r"'idx' must be an int64 or int32 tensor, got a 3-D Float tensor"),
        ((f, i.short()), TypeError, r"'idx' must be an int64 or int32 tensor, got a 3-D Short"),
        ((f, i[0]), ValueError, r"'idx' must be a tensor of shape \[B, M, S\], got a 2-D"),
        ((f, i[None]), ValueError, r"'idx' must be a tensor of shape \[B, M, S\], got a 4-D"),
        ((f, i[:1]), ValueError, r"'idx' must have 2 \(the batch size B of 'features'\) in dimension 0"),
        ((f, i + 10), ValueError, r"'idx' must hold values in \[-1, N\) = \[-1, 10\), got values in \[10, 10\]"),
        ((f, i - 2), ValueError, r"'idx' must hold values in \[-1, N\) = \[-1, 10\), got values in \[-2, -2\]"),
        ((f, i.int() + 10), ValueError, r"'idx' must hold values in \[-1, N\) = \[-1, 10\), got values in \[10, 10\]"),
        ((torch.rand(2, 0, 4, device=device), i), ValueError, r"'idx' must hold values in \[-1, N\) = \[-1, 0\)"),
    ]
    if hasattr(torch, "float8_e4m3fn"):
        cases.append(((f.to(torch.float8_e4m3fn), i), TypeError, r"'features' must be a floating point tensor \(float32, float64, float16 or bfloat16\), got a 3-D Float8"))
    return cases


@pytest.mark.parametrize("case", range(13))
def test_group_bad_inputs_raise(device, case, debug_checks):
    cases = _group_bad_cases(device)
    if case >= len(cases):
        pytest.skip("no float8 in this torch")
    args, exc, pattern = cases[case]
    with pytest.raises(exc, match=r"pcops\.group: .*" + pattern):
        group_op(*args)


def _backward_bad_cases(device):
    g = torch.rand(2, 3, 5, 4, device=device)
    i = torch.zeros(2, 3, 5, dtype=torch.long, device=device)
    return [
        ((g[0], i, 10), ValueError, r"'grad_out' must be a tensor of shape \[B, M, S, C\], got a 3-D"),
        ((g.int(), i, 10), TypeError, r"'grad_out' must be a floating point"),
        ((g, i.float(), 10), TypeError, r"'idx' must be an int64 or int32 tensor, got a 3-D Float"),
        ((g, i[0], 10), ValueError, r"'idx' must be a tensor of shape \[B, M, S\], got a 2-D"),
        ((g, i[:1], 10), ValueError, r"'idx' must have 2 \(the batch size B of 'grad_out'\) in dimension 0"),
        ((g, i[:, :2], 10), ValueError, r"'idx' must have 3 \(M, dimension 1 of 'grad_out'\) in dimension 1"),
        ((g, i[:, :, :4], 10), ValueError, r"'idx' must have 5 \(S, dimension 2 of 'grad_out'\) in dimension 2"),
        ((g, i, -1), ValueError, r"'num_points' must be >= 0, got -1"),
        ((g, i + 10, 10), ValueError, r"'idx' must hold values in \[-1, num_points\) = \[-1, 10\), got values in \[10, 10\]"),
        ((g, i - 5, 10), ValueError, r"'idx' must hold values in \[-1, num_points\) = \[-1, 10\), got values in \[-5, -5\]"),
        ((g, i.int() - 5, 10), ValueError, r"'idx' must hold values in \[-1, num_points\) = \[-1, 10\), got values in \[-5, -5\]"),
    ]


@pytest.mark.parametrize("case", range(11))
def test_group_backward_bad_inputs_raise(device, case, debug_checks):
    args, exc, pattern = _backward_bad_cases(device)[case]
    with pytest.raises(exc, match=r"pcops\.group_backward: .*" + pattern):
        backward_op(*args)


# ---------------------------------------------------------------------------------------------
# CUDA: against the CPU, streams, graphs, compile


def test_mixed_devices_raise(cuda):
    f = torch.rand(2, 10, 4)
    i = torch.zeros(2, 3, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"pcops\.group: .*'idx' must be on the same device as 'features'"):
        group_op(f.cuda(), i)
    with pytest.raises(ValueError, match=r"pcops\.group: .*'features' is .* while another argument is on CUDA"):
        group_op(f, i.cuda())
    g = torch.rand(2, 3, 5, 4)
    with pytest.raises(ValueError, match=r"pcops\.group_backward: .*'idx' must be on the same device as 'grad_out'"):
        backward_op(g.cuda(), i, 10)
    with pytest.raises(ValueError, match=r"pcops\.group_backward: .*'grad_out' is .* while another argument is on CUDA"):
        backward_op(g, i.cuda(), 10)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,N,C,M,S", SIZES + [(32, 1024, 64, 512, 32), (8, 20000, 3, 4096, 16)])
def test_cuda_matches_cpu_bitwise(cuda, gen, dtype, B, N, C, M, S, idx_dtype):
    features = rand_features(B, N, C, gen, dtype=dtype)
    idx = rand_idx(B, M, S, N, gen).to(idx_dtype)
    assert_equal(group_op(features.cuda(), idx.cuda()), group_op(features, idx), what="forward")
    grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype)
    assert_equal(backward_op(grad_out.cuda(), idx.cuda(), N), backward_op(grad_out, idx, N), what="backward")


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,N,C,M,S", [(1, 1, 1, 1, 1), (3, 7, 8, 5, 7), (2, 33, 16, 9, 4)])
def test_cuda_small_against_reference(cuda, gen, dtype, B, N, C, M, S):
    features = rand_features(B, N, C, gen, dtype=dtype)
    idx = rand_idx(B, M, S, N, gen)
    assert_equal(group_op(features.cuda(), idx.cuda()), group_reference(features, idx))
    grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype)
    assert_equal(backward_op(grad_out.cuda(), idx.cuda(), N), expected_backward(grad_out, idx, N))


@pytest.mark.sanitizer
def test_cuda_empty_and_unreferenced(cuda, gen):
    # N = 0 with only -1, a point count far above the referenced ones, M*S = 0
    for B, N, C, M, S in [(2, 0, 4, 3, 2), (2, 5000, 4, 3, 2), (3, 9, 4, 0, 5)]:
        idx = rand_idx(B, M, S, N, gen, high=min(N, 4), device="cuda")
        grad_out = torch.randn(B, M, S, C, device="cuda")
        assert_equal(backward_op(grad_out, idx, N), expected_backward(grad_out, idx, N))
        features = torch.randn(B, N, C, device="cuda")
        assert_equal(group_op(features, idx), group_reference(features, idx))


@pytest.mark.slow
def test_cuda_large_with_wide_rows_and_many_points(cuda, gen):
    B, N, C, M, S = 2, 300000, 260, 2048, 64
    features = rand_features(B, N, C, gen)
    idx = rand_idx(B, M, S, N, gen)
    assert_equal(group_op(features.cuda(), idx.cuda()), group_reference(features, idx))
    grad_out = torch.randn(B, M, S, C, generator=gen)
    assert_equal(backward_op(grad_out.cuda(), idx.cuda(), N), backward_op(grad_out, idx, N))


@pytest.mark.slow
def test_cuda_more_than_2_31_points(cuda):
    """B*N past int32: the backward's 64-bit keys and offsets, the forward's 64-bit row offsets.
    Small integers, so every sum is exact in bfloat16 whatever the order."""
    N = 2**31 + 5
    picked = [0, 1, 2**31 - 1, 2**31, 2**31 + 4, N - 3]
    value = {n: float(j + 1) for j, n in enumerate(picked)}  # every other point is 0
    features = torch.zeros(1, N, 1, dtype=torch.bfloat16, device="cuda")
    features[0, torch.tensor(picked, device="cuda"), 0] = torch.tensor(list(value.values()), dtype=torch.bfloat16, device="cuda")
    flat = picked + picked[::-1] + [-1, 5, 2**31 + 4, -1]
    idx = torch.tensor(flat).view(1, 4, 4)
    out = group_op(features, idx.cuda())
    del features
    assert_equal(out.flatten(), torch.tensor([value.get(n, 0.0) for n in flat]))
    grad_out = torch.arange(1, 17, dtype=torch.bfloat16).view(1, 4, 4, 1)
    grad = backward_op(grad_out.cuda(), idx.cuda(), N)
    touched = sorted(set(n for n in flat if n >= 0))
    sums = [float(sum(j + 1 for j, n in enumerate(flat) if n == t)) for t in touched]
    assert_equal(grad[0, torch.tensor(touched, device="cuda"), 0], torch.tensor(sums))
    assert int((grad != 0).sum()) == len(touched)


def test_cuda_deterministic_over_runs(cuda, gen):
    B, N, C, M, S = 16, 1024, 64, 512, 32
    idx = rand_idx(B, M, S, N, gen, high=200, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype).cuda()
        first = backward_op(grad_out, idx, N)
        for _ in range(3):
            again = backward_op(grad_out, idx, N)
            assert torch.equal(again.view(torch.int16), first.view(torch.int16)), f"{dtype} bits changed"


@pytest.mark.sanitizer
def test_cuda_side_stream(cuda, gen):
    B, N, C, M, S = 4, 300, 32, 64, 16
    features = rand_features(B, N, C, gen)
    idx = rand_idx(B, M, S, N, gen)
    grad_out = torch.randn(B, M, S, C, generator=gen)
    f, i, g = features.cuda(), idx.cuda(), grad_out.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # queue work behind a slow producer on the same stream
            f2 = f * 1.0
            out = group_op(f2, i)
            grad = backward_op(g * 1.0, i, N)
    torch.cuda.current_stream().wait_stream(stream)
    assert_equal(out, group_reference(features, idx))
    assert_equal(grad, group_backward_ordered(grad_out, idx, N))


def test_cuda_graph_capture(cuda, gen):
    """Forward and backward under torch.cuda.graph; replays follow new input values. During
    capture the idx value check is skipped, so out-of-range values must read as -1."""
    B, N, C, M, S = 4, 200, 16, 64, 8
    features = rand_features(B, N, C, gen).cuda()
    idx = rand_idx(B, M, S, N, gen, device="cuda")
    grad_out = torch.randn(B, M, S, C, generator=gen).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        group_op(features, idx)
        backward_op(grad_out, idx, N)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = group_op(features, idx)
        grad = backward_op(grad_out, idx, N)
    for _ in range(2):
        features.copy_(rand_features(B, N, C, gen))
        new_idx = rand_idx(B, M, S, N, gen)
        new_idx[0, 0, :3] = torch.tensor([N, N + 1000, -7])  # out of range: treated as -1
        idx.copy_(new_idx)
        grad_out.copy_(torch.randn(B, M, S, C, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        clean = torch.where((new_idx < 0) | (new_idx >= N), -1, new_idx)
        assert_equal(out, group_reference(features, clean))
        assert_equal(grad, group_backward_ordered(grad_out, clean, N))


def test_cuda_torch_compile_fullgraph(cuda, gen):
    B, N, C, M, S = 2, 64, 8, 16, 4
    features = rand_features(B, N, C, gen).cuda().requires_grad_()
    idx = rand_idx(B, M, S, N, gen, device="cuda")

    def step(f, i):
        return (pcops.group(f, i) - f[:, :M, None, :]).relu().sum(dim=2)

    compiled = torch.compile(step, fullgraph=True)
    out = compiled(features, idx)
    assert_equal(out, step(features, idx))
    (g1,) = torch.autograd.grad(out.sum(), features)
    (g2,) = torch.autograd.grad(step(features, idx).sum(), features)
    assert_equal(g1, g2)
    graphed = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            out = graphed(features, idx)
        assert_equal(out, step(features, idx))
