"""furthest_point_sample for points of any dimension D: against a NumPy reference with the
kernels' summation order (bit for bit; in float64 it is the float64 brute force), D = 3 through
the new path against the 3-D paths, float32 against float64 (the greedy property), ties,
ragged lengths and starts, the overflow rule, half inputs, bad inputs, opcheck, and CPU vs
CUDA bit for bit."""
import numpy as np
import pytest
import torch

import pcops
from helpers import assert_bits, features
from pcops._paths import force

fps_op = torch.ops.pcops.furthest_point_sample.default

DIMS = [1, 2, 3, 4, 7, 16, 64, 130, 1024]


def random_starts(lengths, gen):
    """A start in [0, lengths[b]) per cloud (0 for an empty cloud)."""
    s = (torch.rand(len(lengths), generator=gen, dtype=torch.float64) * lengths).long()
    return torch.minimum(s, (lengths - 1).clamp(min=0))


# ---------------------------------------------------------------------------------------------
# reference


def ordered_dist2(pts):
    """[L, L] squared distances in the array's precision, summed over d = 0 .. D-1 in order
    from +0, each product and sum rounded on its own (NumPy never fuses): the kernels' order
    (kernels/knn_nd.h). The overflow rule: a finite pair's overflow is the dtype's max; a pair
    with a non-finite point is NaN (it lowers no temp)."""
    pts = np.asarray(pts)
    L = len(pts)
    acc = np.zeros((L, L), dtype=pts.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for d in range(pts.shape[1]):
            diff = pts[:, None, d] - pts[None, :, d]
            acc = acc + diff * diff
        finite = np.isfinite(pts).all(1)
        pair = finite[:, None] & finite[None, :]
        acc = np.where(pair & ~(acc <= np.finfo(pts.dtype).max), np.finfo(pts.dtype).max, acc)
    return np.where(pair, acc, np.nan).astype(pts.dtype)


def fps_reference(xyz, npoint, length=None, start=0):
    """Greedy FPS of one cloud written for clarity: temps +inf, a chosen point's temp -1, each
    step lowers the temps with the distances to the newest sample (a NaN lowers nothing) and
    takes the first largest temp (ties to the lower index). Returns (idx, dist2)."""
    xyz = np.asarray(xyz)
    L = len(xyz) if length is None else int(length)
    idx = np.full(npoint, -1, dtype=np.int64)
    dist2 = np.zeros(npoint, dtype=xyz.dtype)
    n_out = min(npoint, L)
    if n_out == 0:
        return idx, dist2
    d = ordered_dist2(xyz[:L])
    temp = np.full(L, np.inf, dtype=xyz.dtype)
    cur = int(start) % L
    idx[0] = cur
    for j in range(1, n_out):
        temp[cur] = -1
        with np.errstate(invalid="ignore"):
            temp = np.where(d[cur] < temp, d[cur], temp)
        cur = int(np.argmax(temp))
        idx[j] = cur
        dist2[j] = temp[cur]
    return idx, dist2


def check_reference(xyz, npoint, idx, dist2, lengths=None, start=None):
    x = xyz.detach().cpu().numpy()
    for b in range(x.shape[0]):
        L = x.shape[1] if lengths is None else int(lengths[b])
        s = 0 if start is None else int(start[b])
        ref_i, ref_d = fps_reference(x[b], npoint, L, s)
        assert_bits(idx[b], torch.from_numpy(ref_i), f"idx[{b}] (L = {L}, start = {s})")
        assert_bits(dist2[b], torch.from_numpy(ref_d), f"dist2[{b}] (L = {L}, start = {s})")


# ---------------------------------------------------------------------------------------------
# CPU results against the reference


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_against_reference(gen, D, dtype):
    B, N = 4, 150
    xyz = features(B, N, D, gen, dtype)
    lengths = torch.tensor([N, 37, 0, 1])
    start = random_starts(lengths, gen)
    for npoint in (1, 40, 200):
        idx, dist2 = fps_op(xyz, npoint, lengths, start)
        assert idx.dtype == torch.int64 and dist2.dtype == dtype
        assert idx.shape == dist2.shape == (B, npoint)
        check_reference(xyz, npoint, idx, dist2, lengths, start)
    idx, dist2 = fps_op(xyz, 60)  # no lengths, no start
    check_reference(xyz, 60, idx, dist2)


@pytest.mark.parametrize("case", ["uniform", "huge", "nonfinite"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dimension_3_matches_the_3d_paths(gen, case, dtype):
    """The new path at D = 3 chooses what the 3-D paths choose, bit for bit. The op takes its
    3-D paths for D = 3, so the new path is reached with a zero coordinate added (D = 4),
    first or last: ((0 + a) + b) + c and (((0 + 0) + a) + b) + c and ((a + b) + c) + 0 are
    the 3-D formula's bits, (a + b) + c, for every sum >= +0, +inf and the max included. The
    reference at D = 3 agrees too."""
    B, N, npoint = 3, 300, 120
    xyz = features(B, N, 3, gen, dtype)
    if case == "huge":  # squared distances overflow in parts of the cloud
        big = 1e20 if dtype == torch.float32 else 1e160
        xyz[:, ::7] *= big
    elif case == "nonfinite":
        xyz[0, 17, 1] = float("nan")
        xyz[0, 5, 2] = float("inf")
        xyz[1, 0, 0] = float("-inf")  # the default start of cloud 1
    lengths = torch.tensor([N, 200, 77])
    start = torch.tensor([3, 0, 76])
    zeros = torch.zeros(B, N, 1, dtype=dtype)
    for path in ("simple", "tree"):
        i3, d3 = force("furthest_point_sample", path, xyz, npoint, lengths, start)
        for padded in (torch.cat([xyz, zeros], 2), torch.cat([zeros, xyz], 2)):
            i4, d4 = fps_op(padded, npoint, lengths, start)
            assert_bits(i4, i3, f"idx, D = 4 vs the 3-D path '{path}'")
            assert_bits(d4, d3, f"dist2, D = 4 vs the 3-D path '{path}'")
    check_reference(xyz, npoint, i3, d3, lengths, start)


@pytest.mark.parametrize("D", [1, 2, 4, 7, 16, 64, 130, 1024])
def test_float32_against_float64(gen, D):
    """Replayed in float64 on the float32 inputs, every float32 choice is a farthest point up
    to the float32 summation bound ((D + 3) u relatively, u = 2**-24, on both distances), and
    the float64 run (bit for bit the float64 brute force, test above) satisfies it exactly."""
    B, N, npoint = 2, 200, 60
    x32 = features(B, N, D, gen, torch.float32)
    idx, _ = fps_op(x32, npoint)
    idx64, _ = fps_op(x32.double(), npoint)
    rtol = 2 * (D + 3) * 2.0**-24
    for b in range(B):
        pts = x32[b].double()
        for chosen, tol in ((idx[b], rtol), (idx64[b], 1e-12)):
            temp = torch.full((N,), float("inf"), dtype=torch.float64)
            taken = torch.zeros(N, dtype=torch.bool)
            for j, c in enumerate(chosen.tolist()):
                if j > 0:
                    best = temp.masked_fill(taken, -1).max()
                    assert not taken[c], f"cloud {b}: sample {j} ({c}) chosen twice"
                    assert temp[c] >= best * (1 - tol), (
                        f"cloud {b}, D = {D}: sample {j} ({c}) at {temp[c].item()}, a farthest "
                        f"point at {best.item()}")
                taken[c] = True
                temp = torch.minimum(temp, ((pts - pts[c]) ** 2).sum(1))


@pytest.mark.parametrize("D", [1, 4, 64])
def test_ties_and_duplicates(gen, D):
    """Integer coordinates in a small range, every point repeated: exact ties everywhere go to
    the lower index, and no index is chosen twice while points remain."""
    base = torch.randint(-2, 3, (2, 30, D), generator=gen).float()
    xyz = torch.cat([base, base, base], 1)
    idx, dist2 = fps_op(xyz, 90)
    check_reference(xyz, 90, idx, dist2)
    for b in range(2):
        assert len(set(idx[b].tolist())) == 90


def test_half_inputs(gen):
    xyz = features(2, 80, 6, gen)
    for dtype in (torch.float16, torch.bfloat16):
        x = xyz.to(dtype)
        idx, dist2 = fps_op(x, 20)
        i32, d32 = fps_op(x.float(), 20)
        assert dist2.dtype == dtype
        assert_bits(idx, i32, f"idx ({dtype} computes in float32)")
        assert_bits(dist2, d32.to(dtype), f"dist2 ({dtype})")


def test_wrapper_random_start_and_unique_indices(gen):
    xyz = features(3, 50, 5, gen, torch.float64)
    lengths = torch.tensor([50, 7, 1])
    for _ in range(3):
        idx, dist2 = pcops.furthest_point_sample(xyz, 10, lengths, random_start=True,
                                                 return_dist2=True)
        assert ((idx[:, 0] >= 0) & (idx[:, 0] < lengths)).all()
        check_reference(xyz, 10, idx, dist2, lengths, idx[:, 0])


def test_non_contiguous_input(gen):
    xyz = features(2, 7, 60, gen).transpose(1, 2)  # [2, 60, 7], not contiguous
    idx, dist2 = fps_op(xyz, 25)
    check_reference(xyz.contiguous(), 25, idx, dist2)


# ---------------------------------------------------------------------------------------------
# checks, forced paths, opcheck


def test_bad_inputs_raise():
    xyz = torch.rand(2, 10, 5)
    cases = [
        ((torch.rand(2, 10, 0), 3), r"argument 'xyz' must be a tensor of shape \[B, N, D\] "
                                    r"with D >= 1"),
        ((torch.rand(10, 5), 3), r"argument 'xyz' must be a tensor of shape \[B, N, D\]"),
        ((xyz, 0), r"argument 'npoint'"),
        ((xyz, 3, torch.tensor([10, 11])), r"argument 'lengths'"),
        ((xyz, 3, None, torch.tensor([0, 10])), r"argument 'start'"),
    ]
    for args, pattern in cases:
        with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: .*" + pattern):
            fps_op(*args)


def test_forced_paths_with_any_dimension(gen):
    xyz = features(2, 3000, 5, gen)
    i, d = force("furthest_point_sample", "simple", xyz, 1000, None, None)
    i0, d0 = fps_op(xyz, 1000)
    assert_bits(i, i0, "idx, forced simple")
    assert_bits(d, d0, "dist2, forced simple")
    with pytest.raises(ValueError, match="path 'tree' cannot take these inputs"):
        force("furthest_point_sample", "tree", xyz, 1000, None, None)


def test_opcheck(device, gen):
    xyz = features(2, 40, 6, gen, device=device)
    lengths = torch.tensor([40, 17], device=device)
    torch.library.opcheck(fps_op, (xyz, 10))
    torch.library.opcheck(fps_op, (xyz, 30, lengths, torch.tensor([3, 16], device=device)))


def test_compile_and_vmap(gen):
    xyz = features(3, 30, 5, gen)
    f = torch.compile(lambda x: pcops.furthest_point_sample(x, 8), fullgraph=True)
    assert_bits(f(xyz), fps_op(xyz, 8)[0], "idx under torch.compile")
    v = torch.vmap(lambda x: pcops.furthest_point_sample(x, 8))(xyz.reshape(3, 1, 30, 5))
    assert_bits(v.reshape(3, 8), fps_op(xyz, 8)[0], "idx under vmap")


# ---------------------------------------------------------------------------------------------
# CUDA: the same bits as the CPU


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu_bitwise(cuda, gen, D, dtype):
    B, N = 4, 700  # more points than the block's 256 threads
    half = features(B, N // 2, D, gen, dtype)
    xyz = torch.cat([half, half], 1)  # duplicates: ties
    lengths = torch.tensor([N, 300, 0, 1])
    start = random_starts(lengths, gen)
    for npoint in (1, 64, 800):
        i_cpu, d_cpu = fps_op(xyz, npoint, lengths, start)
        i_cu, d_cu = fps_op(xyz.cuda(), npoint, lengths.cuda(), start.cuda())
        assert_bits(i_cu, i_cpu, f"idx (npoint = {npoint})")
        assert_bits(d_cu, d_cpu, f"dist2 (npoint = {npoint})")


@pytest.mark.parametrize("case", ["huge", "nonfinite"])
def test_cuda_overflow_rule(cuda, gen, case):
    xyz = features(2, 400, 9, gen)
    if case == "huge":
        xyz[:, ::5] *= 1e20
    else:
        xyz[0, 3, 4] = float("nan")
        xyz[0, 0, 8] = float("inf")
        xyz[1, 399, 0] = float("-inf")
    i_cpu, d_cpu = fps_op(xyz, 100)
    check_reference(xyz, 100, i_cpu, d_cpu)
    i_cu, d_cu = fps_op(xyz.cuda(), 100)
    assert_bits(i_cu, i_cpu, "idx")
    assert_bits(d_cu, d_cpu, "dist2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_dimension_3_matches_the_3d_paths(cuda, gen, dtype):
    """On the GPU too: the new kernel at D = 3 (a zero coordinate added) has the bits of the
    3-D paths that AUTO takes there, for a cloud of each size class."""
    for N, npoint in ((100, 50), (1000, 300), (5000, 600)):
        xyz = features(2, N, 3, gen, dtype).cuda()
        lengths = torch.tensor([N, N // 3], device="cuda")
        i3, d3 = fps_op(xyz, npoint, lengths)
        zeros = torch.zeros(2, N, 1, dtype=dtype, device="cuda")
        i4, d4 = fps_op(torch.cat([xyz, zeros], 2), npoint, lengths)
        assert_bits(i4, i3, f"idx, N = {N}")
        assert_bits(d4, d3, f"dist2, N = {N}")
