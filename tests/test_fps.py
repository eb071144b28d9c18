"""furthest_point_sample: against independent NumPy references, properties, dtypes, bad inputs."""
import numpy as np
import pytest
import torch

import fps_capacity
import pcops
from helpers import (FLOAT_DTYPES, assert_close, assert_equal, clustered_points, dist2_saturated, rand_points,
                     random_lengths)

fps_op = torch.ops.pcops.furthest_point_sample.default
from pcops._paths import PATHS, force, paths  # noqa: E402


def fps_path(xyz, npoint, lengths=None, start=None, *, path):
    """furthest_point_sample forced through one path (pcops._paths): (idx, dist2)."""
    return force("furthest_point_sample", path, xyz, npoint, lengths, start)



# ---------------------------------------------------------------------------------------------
# references


def fps_reference(xyz, npoint, length=None, start=0):
    """Greedy FPS of one cloud written for clarity, in the array's own precision (float32 or
    float64) with the contract's formula: d = (dx*dx + dy*dy) + dz*dz, chosen points set to -1,
    ties to the lowest index (np.argmax returns the first maximum); an overflow saturates
    (helpers.dist2_saturated)."""
    xyz = np.asarray(xyz)
    L = len(xyz) if length is None else int(length)
    idx = np.full(npoint, -1, dtype=np.int64)
    dist2 = np.zeros(npoint, dtype=xyz.dtype)
    n_out = min(npoint, L)
    if n_out == 0:
        return idx, dist2
    pts = xyz[:L]
    temp = np.full(L, np.inf, dtype=xyz.dtype)
    cur = int(start) % L
    idx[0] = cur
    for j in range(1, n_out):
        temp[cur] = -1
        d = dist2_saturated(pts, pts[cur : cur + 1])[:, 0]
        temp = np.where(d < temp, d, temp)
        cur = int(np.argmax(temp))
        idx[j] = cur
        dist2[j] = temp[cur]
    return idx, dist2


def farthest_property_violations(xyz, idx, length, rtol=1e-6, atol=1e-12):
    """Replays the op's choices in float64 and lists the steps j whose chosen point is not a
    farthest point (its float64 distance to the earlier samples below the maximum by more than
    rtol relative). Float near-ties may flip in float32, so this is the property to test."""
    pts = np.asarray(xyz, dtype=np.float64)[:length]
    chosen = [int(i) for i in idx if i >= 0]
    temp = np.full(len(pts), np.inf)
    bad = []
    for j, c in enumerate(chosen):
        if j > 0:
            free = temp.copy()
            free[chosen[:j]] = -np.inf
            best = free.max()
            if temp[c] < best * (1 - rtol) - atol:
                bad.append((j, c, temp[c], best))
        temp = np.minimum(temp, ((pts - pts[c]) ** 2).sum(1))
    return bad


def check_row_properties(idx, dist2, L, npoint):
    """Unique in-range indices in the first min(npoint, L) slots, -1 and 0 after them, dist2
    starting at 0 and not increasing."""
    n_out = min(npoint, L)
    head = idx[:n_out]
    assert ((head >= 0) & (head < L)).all(), f"indices outside [0, {L}): {head}"
    assert len(np.unique(head)) == n_out, "duplicate indices"
    assert (idx[n_out:] == -1).all(), "slots past min(npoint, L) must be -1"
    assert (dist2[n_out:] == 0).all(), "dist2 of empty slots must be 0"
    if n_out:
        assert dist2[0] == 0
        assert (np.diff(dist2[1:n_out]) <= 0).all(), "coverage radius increased"


# ---------------------------------------------------------------------------------------------
# results


@pytest.mark.parametrize("N,npoint", [(1, 1), (2, 5), (3, 3), (5, 2), (7, 7), (8, 3), (33, 16),
                                      (257, 100), (1000, 1000), (4099, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference(device, gen, N, npoint, dtype):
    B = 3
    xyz = rand_points(B, N, gen, dtype=dtype)
    idx, dist2 = fps_op(xyz.to(device), npoint)
    for b in range(B):
        ref_idx, ref_d = fps_reference(xyz[b].numpy(), npoint)
        assert_equal(idx[b], torch.from_numpy(ref_idx), what=f"idx[{b}]")
        assert_equal(dist2[b], torch.from_numpy(ref_d), what=f"dist2[{b}]")


@pytest.mark.parametrize("case", ["uniform", "clustered", "utm"])
def test_ragged_batches_and_start(device, gen, case):
    B, N, npoint = 6, 300, 120
    if case == "uniform":
        xyz = rand_points(B, N, gen)
    elif case == "clustered":  # many exact ties and duplicate points
        xyz = clustered_points(B, N, gen, clusters=4)
    else:  # lidar in UTM metres: 1e5 offsets, a 100 m extent
        xyz = rand_points(B, N, gen, scale=100.0, offset=1e5)
    lengths = random_lengths(B, N, gen)
    lengths[0] = 0
    lengths[1] = N
    lengths[2] = 1
    start = (torch.rand(B, generator=gen) * lengths).long().clamp(min=0)
    start = torch.minimum(start, (lengths - 1).clamp(min=0))
    idx, dist2 = fps_op(xyz.to(device), npoint, lengths.to(device), start.to(device))
    idx, dist2 = idx.cpu().numpy(), dist2.cpu().numpy()
    for b in range(B):
        L = int(lengths[b])
        ref_idx, ref_d = fps_reference(xyz[b].numpy(), npoint, L, int(start[b]))
        np.testing.assert_array_equal(idx[b], ref_idx, err_msg=f"cloud {b}, L={L}")
        np.testing.assert_array_equal(dist2[b], ref_d, err_msg=f"cloud {b}, L={L}")
        check_row_properties(idx[b], dist2[b], L, npoint)


@pytest.mark.parametrize("offset,scale", [(0.0, 1.0), (1e5, 200.0), (-3e4, 1e-2)])
def test_farthest_point_property_in_float64(device, gen, offset, scale):
    B, N, npoint = 2, 2000, 600
    xyz = rand_points(B, N, gen, scale=scale, offset=offset)
    idx = fps_op(xyz.to(device), npoint)[0].cpu().numpy()
    for b in range(B):
        bad = farthest_property_violations(xyz[b].numpy(), idx[b], N)
        assert not bad, f"cloud {b}: steps that did not take a farthest point: {bad[:5]}"


def test_utm_coordinates_sample_like_the_origin(device, gen):
    """A cloud moved by 1e5 picks the same points as the original where float32 resolves the
    distances: no 1e10-style sentinel caps the distances."""
    xyz = torch.randint(0, 64, (1, 500, 3), generator=gen).float()  # exact in float32 at 1e5
    near = fps_op(xyz.to(device), 200)[0]
    far = fps_op((xyz + 1e5).to(device), 200)[0]
    assert_equal(far, near, what="idx")


@pytest.mark.parametrize("N,npoint", [(1, 1), (4, 4), (50, 50), (50, 80), (1000, 1000)])
def test_duplicates_and_constant_clouds_give_unique_indices(device, gen, N, npoint):
    base = rand_points(1, (N + 3) // 4, gen)
    dup = base.repeat(1, 4, 1)[:, :N]  # every point 4 times
    const = torch.full((1, N, 3), 0.25)
    for xyz in (dup, const):
        idx, dist2 = fps_op(xyz.to(device), npoint)
        check_row_properties(idx[0].cpu().numpy(), dist2[0].cpu().numpy(), N, npoint)
        ref_idx, _ = fps_reference(xyz[0].numpy(), npoint)
        assert_equal(idx[0], torch.from_numpy(ref_idx), what="idx")
    # a constant cloud ties everywhere: lowest index first
    assert_equal(fps_op(const.to(device), npoint)[0][0, : min(N, npoint)], torch.arange(min(N, npoint)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_dtype_computes_in_float32_or_float64(device, gen, dtype):
    xyz = rand_points(2, 500, gen, dtype=dtype)
    idx, dist2 = fps_op(xyz.to(device), 128)
    assert idx.dtype == torch.int64 and dist2.dtype == dtype
    work = xyz.double() if dtype == torch.float64 else xyz.float()  # half types: exact upcast
    for b in range(2):
        ref_idx, ref_d = fps_reference(work[b].numpy(), 128)
        assert_equal(idx[b], torch.from_numpy(ref_idx), what="idx")
        assert_equal(dist2[b], torch.from_numpy(ref_d).to(dtype), what="dist2")


def test_non_contiguous_input(device, gen):
    big = rand_points(4, 400, gen).to(device)
    xyz = big.transpose(0, 1).contiguous().transpose(0, 1)[::2, ::2]  # strided in every dim
    assert not xyz.is_contiguous()
    assert_equal(fps_op(xyz, 64)[0], fps_op(xyz.contiguous(), 64)[0])


def test_empty_batch_and_empty_clouds(device):
    idx, dist2 = fps_op(torch.empty(0, 10, 3, device=device), 4)
    assert idx.shape == (0, 4) and dist2.shape == (0, 4)
    idx, dist2 = fps_op(torch.empty(2, 0, 3, device=device), 3)
    assert (idx == -1).all() and (dist2 == 0).all()


def test_random_start_is_in_range_and_reproducible(device, gen):
    B, N = 64, 50
    xyz = rand_points(B, N, gen).to(device)
    lengths = random_lengths(B, N, gen, device=device)
    torch.manual_seed(1234)
    a = pcops.furthest_point_sample(xyz, 5, lengths, random_start=True)
    torch.manual_seed(1234)
    b = pcops.furthest_point_sample(xyz, 5, lengths, random_start=True)
    assert_equal(a, b)
    first = a[:, 0].cpu()
    valid = lengths.cpu() > 0
    assert ((first[valid] >= 0) & (first[valid] < lengths.cpu()[valid])).all()
    assert (first[~valid] == -1).all()
    assert len(set(first[lengths.cpu() > 1].tolist())) > 1, "random starts all equal"
    # and each row is the FPS from its own first sample
    for bb in range(B):
        ref_idx, _ = fps_reference(xyz[bb].cpu().numpy(), 5, int(lengths[bb]), max(int(first[bb]), 0))
        assert_equal(a[bb], torch.from_numpy(ref_idx))


def test_wrapper_returns_idx_or_pair(gen):
    xyz = rand_points(2, 30, gen)
    idx = pcops.furthest_point_sample(xyz, 8)
    idx2, dist2 = pcops.furthest_point_sample(xyz, 8, return_dist2=True)
    assert_equal(idx, idx2)
    assert dist2.shape == (2, 8)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, gen, requires_grad):
    xyz = rand_points(2, 40, gen).to(device).requires_grad_(requires_grad)
    lengths = torch.tensor([40, 17], device=device)
    torch.library.opcheck(fps_op, (xyz, 10))
    torch.library.opcheck(fps_op, (xyz, 50, lengths, torch.tensor([3, 16], device=device)))


# ---------------------------------------------------------------------------------------------
# bad inputs: each raises a Python exception naming the op and the argument


def _bad_cases(device):
    x = torch.rand(2, 10, 3, device=device)
    L = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    return [
        ((torch.rand(10, 3, device=device), 4), ValueError, r"'xyz' must be a tensor of shape \[B, N, D\] with D >= 1, got a 2-D"),
        ((torch.rand(2, 10, 0, device=device), 4), ValueError, r"'xyz' must be a tensor of shape \[B, N, D\] with D >= 1"),
        ((torch.ones(2, 10, 3, dtype=torch.int32, device=device), 4), TypeError, r"'xyz' must be a floating point"),
        ((torch.ones(2, 10, 3, dtype=torch.bool, device=device), 4), TypeError, r"'xyz' must be a floating point"),
        ((x, 0), ValueError, r"'npoint' must be >= 1, got 0"),
        ((x, -3), ValueError, r"'npoint' must be >= 1, got -3"),
        ((x, 4, L(3)), ValueError, r"'lengths' must have 2 \(the batch size B\)"),
        ((x, 4, L(3.0, 4.0)), TypeError, r"'lengths' must be an int64 tensor"),
        ((x, 4, L(3, 11)), ValueError, r"'lengths' must hold values in \[0, N\] = \[0, 10\], got values in \[3, 11\]"),
        ((x, 4, L(-1, 5)), ValueError, r"'lengths' must hold values in \[0, N\]"),
        ((x, 4, None, L(0, 0, 0)), ValueError, r"'start' must have 2 \(the batch size B"),
        ((x, 4, None, L(0.0, 1.0)), TypeError, r"'start' must be an int64 tensor"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_bad_inputs_raise(device, case, debug_checks):
    args, exc, pattern = _bad_cases(device)[case]
    with pytest.raises(exc, match=r"pcops\.furthest_point_sample: .*" + pattern):
        fps_op(*args)


def _bad_start_cases():
    """Values of `start` are checked by the op itself on the CPU (on CUDA in debug mode: a check
    there would synchronise with the host, so by default the kernels take start modulo
    lengths[b])."""
    x = torch.rand(2, 10, 3)
    L = lambda *v: torch.tensor(v)  # noqa: E731
    return [
        ((x, 4, None, L(0, 10)), {}, r"'start' must hold, for each b, a value in \[0, lengths\[b\]\).*start\[1\] = 10"),
        ((x, 4, L(5, 5), L(0, 5)), {}, r"start\[1\] = 5 with lengths\[1\] = 5"),
        ((x, 4, None, L(-1, 0)), {}, r"start\[0\] = -1"),
        ((x, 4, None, L(0, 0)), {"random_start": True}, r"either 'start' or random_start=True"),
    ]


@pytest.mark.parametrize("case", range(4))
def test_bad_start_raises_in_the_wrapper(case):
    args, kwargs, pattern = _bad_start_cases()[case]
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: .*" + pattern):
        pcops.furthest_point_sample(*args, **kwargs)


@pytest.mark.parametrize("path", [None, "simple", "tree"])
@pytest.mark.parametrize("case", range(3))
def test_bad_start_raises_in_the_op(device, case, path, debug_checks):
    """The raw op (and each forced path) checks start's values too: on the CPU always, on CUDA
    in debug mode. It used to run from start = 0 for start = N."""
    args, _, pattern = _bad_start_cases()[case]
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    if path is not None and path not in paths("furthest_point_sample", device):
        pytest.skip(f"no {path} path on {device}")
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: .*" + pattern):
        if path is None:
            fps_op(*args)
        else:
            force("furthest_point_sample", path, *args)


def test_start_values_inside_lengths_and_empty_clouds_pass(device, gen):
    """start[b] in [0, lengths[b]) passes; a cloud of length 0 ignores its start (any value)."""
    xyz = rand_points(3, 50, gen).to(device)
    lengths = torch.tensor([50, 7, 0], device=device)
    got = fps_op(xyz, 5, lengths, torch.tensor([49, 6, 123], device=device))
    want = fps_op(xyz, 5, lengths, torch.tensor([49, 6, 0], device=device))
    assert_equal(got[0], want[0])
    assert got[0][0, 0] == 49 and got[0][1, 0] == 6


def test_cuda_start_out_of_range_is_taken_modulo_length_without_debug_checks(cuda, gen):
    """On CUDA, outside debug mode, the op (no check, no host read) takes start[b] modulo
    lengths[b], as the C API documents."""
    previous = pcops.set_debug_checks(False)
    try:
        xyz = rand_points(3, 50, gen).to(cuda)
        lengths = torch.tensor([50, 7, 0], device=cuda)
        got = fps_op(xyz, 5, lengths, torch.tensor([53, -1, 4], device=cuda))
        want = fps_op(xyz, 5, lengths, torch.tensor([3, 6, 0], device=cuda))
    finally:
        pcops.set_debug_checks(previous)
    assert_equal(got[0], want[0])
    assert_equal(got[1], want[1])


def test_random_start_lies_within_the_lengths(device, gen):
    """random_start draws start[b] in [0, lengths[b]) (the op checks it on the CPU), covering
    the range, and the first sample is that start."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    xyz = rand_points(3, 20, gen).to(device)
    lengths = torch.tensor([20, 3, 0], device=device)
    firsts = torch.stack([pcops.furthest_point_sample(xyz, 2, lengths, random_start=True)[:, 0]
                          for _ in range(60)]).cpu()
    assert ((firsts[:, 0] >= 0) & (firsts[:, 0] < 20)).all()
    assert set(firsts[:, 1].tolist()) == {0, 1, 2}
    assert (firsts[:, 2] == -1).all()


def test_npoint_whose_outputs_cannot_be_allocated_raises_naming_npoint(device):
    x = torch.rand(2, 10, 3, device=device)
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: argument 'npoint' asks for an output of shape \[2, 1099511627776\]"):
        fps_op(x, 2**40)
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: argument 'npoint' asks for an output of shape \[2, 4611686018427387904\]"):
        fps_op(x, 2**62)


def test_cuda_cloud_over_int32_points_raises_naming_the_op(cuda):
    xyz = torch.zeros(1, 1, 3, device="cuda").expand(1, 2**31, 3)  # a view: nothing allocated
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: argument 'xyz' has N = 2147483648 points per cloud; at most 2\*\*31 - 1"):
        fps_op(xyz, 4)


def test_mixed_devices_raise(cuda):
    x = torch.rand(2, 10, 3)
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: .*'lengths' must be on the same device"):
        fps_op(x.cuda(), 4, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: .*'xyz' is .* while another argument is on CUDA"):
        fps_op(x, 4, torch.tensor([3, 4], device="cuda"))


# ---------------------------------------------------------------------------------------------
# CUDA: agreement with the CPU (identical arithmetic: bitwise equal), streams, graphs, compile


@pytest.mark.parametrize("N,npoint", [(1, 1), (2, 2), (3, 5), (4, 4), (5, 3), (6, 6), (7, 2), (8, 8),
                                      (127, 64), (128, 128), (129, 100), (511, 300), (512, 512),
                                      (513, 513), (1024, 512), (4095, 1024), (8192, 2048),
                                      (8193, 1000), (20000, 2000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_equals_cpu(cuda, gen, N, npoint, dtype):
    B = 3
    xyz = rand_points(B, N, gen, dtype=dtype)
    lengths = torch.tensor([N, max(N // 2, 1), max(N - 1, 0)])
    cpu = fps_op(xyz, npoint, lengths)
    gpu = fps_op(xyz.cuda(), npoint, lengths.cuda())
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.parametrize("case", ["clustered", "utm", "duplicates"])
def test_cuda_equals_cpu_on_ties(cuda, gen, case):
    if case == "clustered":
        xyz = clustered_points(4, 3000, gen, clusters=3)
    elif case == "utm":
        xyz = rand_points(4, 3000, gen, scale=50.0, offset=1e5)
    else:
        xyz = rand_points(4, 750, gen).repeat(1, 4, 1)
    cpu = fps_op(xyz, 3000)
    gpu = fps_op(xyz.cuda(), 3000)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


def test_cuda_large_single_cloud(cuda, gen):
    """The user complaint: one 200k-point cloud. Bitwise equal to the CPU, and farthest-point
    in float64 on a prefix of the samples."""
    xyz = rand_points(1, 200_000, gen)
    gpu = fps_op(xyz.cuda(), 2000)
    cpu = fps_op(xyz, 2000)
    assert_equal(gpu[0], cpu[0], what="idx")
    check_row_properties(gpu[0][0].cpu().numpy(), gpu[1][0].cpu().numpy(), 200_000, 2000)


def test_cuda_deterministic(cuda, gen):
    xyz = rand_points(8, 5000, gen).cuda()
    a = fps_op(xyz, 1000)
    b = fps_op(xyz, 1000)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cuda_side_stream(cuda, gen):
    xyz = rand_points(4, 3000, gen).cuda()
    expected = fps_op(xyz, 500)[0]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device="cuda") @ torch.randn(4096, 4096, device="cuda")  # keep s busy
        got = fps_op(xyz * 1.0, 500)[0]
    torch.cuda.current_stream().wait_stream(s)
    assert_equal(got, expected)
    del big


def test_cuda_graph_capture_and_random_start_without_sync(cuda, gen):
    xyz = rand_points(4, 2000, gen).cuda()
    lengths = torch.tensor([2000, 1000, 7, 0], device="cuda")
    static_out = {}
    fps_op(xyz, 64, lengths)  # warm up outside the graph
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out["idx"], static_out["dist2"] = fps_op(xyz, 64, lengths)
    xyz.copy_(rand_points(4, 2000, gen).cuda())
    g.replay()
    expected = fps_op(xyz.cpu(), 64, lengths.cpu())
    assert_equal(static_out["idx"], expected[0])
    # random_start performs no host synchronisation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        idx = pcops.furthest_point_sample(xyz, 64, random_start=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ((idx[:, 0] >= 0) & (idx[:, 0] < 2000)).all()


def test_cuda_torch_compile_fullgraph(cuda, gen):
    xyz = rand_points(2, 1000, gen).cuda()

    def f(x):
        idx = pcops.furthest_point_sample(x * 2.0, 100)
        return x.gather(1, idx[..., None].expand(-1, -1, 3)).sum()

    compiled = torch.compile(f, fullgraph=True)
    assert torch.allclose(compiled(xyz), f(xyz))


@pytest.mark.sanitizer
@pytest.mark.parametrize("N,npoint,dtype", [(5, 8, torch.float32), (300, 100, torch.float32),
                                            (1500, 700, torch.float64), (9000, 50, torch.float32)])
def test_cuda_sanitizer_cases(cuda, gen, N, npoint, dtype):
    xyz = rand_points(3, N, gen, dtype=dtype)
    lengths = torch.tensor([N, N // 2, 0])
    start = torch.tensor([N - 1, 0, 0])
    gpu = fps_op(xyz.cuda(), npoint, lengths.cuda(), start.cuda())
    cpu = fps_op(xyz, npoint, lengths, start)
    assert_equal(gpu[0], cpu[0], what="idx")


# ---------------------------------------------------------------------------------------------
# every path against the simple one, bit for bit, on the same inputs


def _path_inputs(case, B, N, gen, dtype):
    """(xyz, lengths, start) for the path tests: ragged lengths and random starts every time."""
    if case == "uniform":
        xyz = rand_points(B, N, gen, dtype=dtype)
    elif case == "ties":  # a coarse grid: many exactly equal distances
        xyz = clustered_points(B, N, gen, dtype=dtype, clusters=5)
    elif case == "duplicates":  # every point four times, and a constant cloud
        xyz = rand_points(B, (N + 3) // 4, gen, dtype=dtype).repeat(1, 4, 1)[:, :N].contiguous()
        xyz[-1] = 0.5
    elif case == "utm":  # huge coordinates: 1e5 m offsets
        xyz = rand_points(B, N, gen, dtype=dtype, scale=300.0, offset=4.5e5)
    elif case == "huge":  # squared distances overflow float32 to inf in parts of the cloud
        xyz = rand_points(B, N, gen, dtype=dtype, scale=3e19, offset=-1.5e19)
    elif case == "blobs":  # dense blobs far apart: most of a cloud's space empty
        centres = torch.rand(B, 6, 3, generator=gen, dtype=torch.float64) * 100
        which = torch.randint(0, 6, (B, N), generator=gen)
        pts = torch.randn(B, N, 3, generator=gen, dtype=torch.float64) * 0.05
        xyz = (torch.gather(centres, 1, which[..., None].expand(-1, -1, 3)) + pts).to(dtype)
    else:  # uniform, then NaN / inf points, or flat ("plane") or collinear ("line") clouds
        xyz = rand_points(B, N, gen, dtype=dtype)
        if case == "nonfinite":
            for b, n, a, v in ((0, 17, 1, "nan"), (0, N // 2, 2, "inf"), (1, 5, 0, "-inf")):
                if b < B and n < N:
                    xyz[b, n, a] = float(v)
            if B > 1 and N > 6:
                xyz[1, 6] = float("nan")
        elif case == "plane":
            xyz[..., 2] = 1.0
        elif case == "line":
            xyz[..., 1:] = 0.25
        else:
            raise ValueError(f"unknown case {case}")
    lengths = random_lengths(B, N, gen)
    lengths[0] = N
    start = torch.randint(0, max(N, 1), (B,), generator=gen) % lengths.clamp(min=1)
    return xyz, lengths, start


CPU_PATH_CASES = [(1, 1), (2, 5), (63, 63), (64, 30), (65, 65), (200, 150), (1000, 400),
                  (4097, 1500), (20001, 3000)]


@pytest.mark.parametrize("case", ["uniform", "ties", "duplicates", "utm", "huge"])
@pytest.mark.parametrize("N,npoint", CPU_PATH_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_tree_path_equals_simple_path(gen, case, N, npoint, dtype):
    """The KD-tree path skips whole boxes; its samples and dist2 must be the simple path's bits
    (ties to the lower index, unique indices on duplicates, ragged lengths, random start)."""
    xyz, lengths, start = _path_inputs(case, 3, N, gen, dtype)
    simple = fps_path(xyz, npoint, lengths, start, path="simple")
    tree = fps_path(xyz, npoint, lengths, start, path="tree")
    assert_equal(tree[0], simple[0], what="idx")
    assert_equal(tree[1], simple[1], what="dist2")
    auto = fps_op(xyz, npoint, lengths, start)
    assert_equal(auto[0], simple[0], what="idx")
    if case != "huge":  # there dist2 holds +inf, whose differences are NaN
        for b in range(3):
            check_row_properties(tree[0][b].numpy(), tree[1][b].numpy(), int(lengths[b]), npoint)


def test_cpu_tree_path_matches_the_numpy_reference(gen):
    xyz, lengths, start = _path_inputs("ties", 2, 3000, gen, torch.float32)
    tree = fps_path(xyz, 800, lengths, start, path="tree")
    for b in range(2):
        ref_idx, ref_d = fps_reference(xyz[b].numpy(), 800, int(lengths[b]), int(start[b]))
        assert_equal(tree[0][b], torch.from_numpy(ref_idx), what="idx")
        assert_equal(tree[1][b], torch.from_numpy(ref_d), what="dist2")


def test_cpu_tree_path_with_non_finite_coordinates_equals_simple(gen):
    """Boxes mean nothing with inf/NaN coordinates: such a cloud takes the simple path."""
    xyz = rand_points(2, 5000, gen)
    xyz[0, 17, 1] = float("nan")
    xyz[1, 4000, 2] = float("inf")
    simple = fps_path(xyz, 600, path="simple")
    tree = fps_path(xyz, 600, path="tree")
    assert_equal(tree[0], simple[0], what="idx")
    assert_equal(tree[1], simple[1], what="dist2")


def test_cpu_tree_path_on_a_real_lidar_scan():
    import os
    path = os.path.join(os.path.dirname(__file__), "..", ".data", "scans", "kitti_velodyne_000000.npy")
    if not os.path.exists(path):
        pytest.skip("no .data/scans/kitti_velodyne_000000.npy")
    xyz = torch.from_numpy(np.load(path)[:, :3].astype(np.float32))[None]
    start = torch.tensor([12345])
    simple = fps_path(xyz, 1500, None, start, path="simple")
    tree = fps_path(xyz, 1500, None, start, path="tree")
    assert_equal(tree[0], simple[0], what="idx")
    assert_equal(tree[1], simple[1], what="dist2")


def test_cpu_paths_reject_cuda_paths():
    with pytest.raises(ValueError, match=r"pcops\._furthest_point_sample_path: path 'block' does not run on the CPU"):
        fps_path(torch.rand(1, 10, 3), 4, path="block")


def test_path_op_opcheck(device, gen):
    xyz = rand_points(2, 40, gen).to(device)
    torch.library.opcheck(torch.ops.pcops._furthest_point_sample_path.default,
                          (xyz, 10, None, None, PATHS["furthest_point_sample"]["simple"][0]))


# Whether a forced CUDA path takes a cloud of N points on the current GPU (tests/fps_capacity.py:
# the plan functions of kernels/fps/*.cuh, the shared-memory paths by the GPU's opt-in limit):
# True, False (it raises ValueError), None (it does not run for the dtype: bucket_groups and
# the bucket_rounds paths are float32 only). warp, block: registers; block_pruned and the grouped
# bucket paths: registers and shared memory; simple, cluster, grid and bucket: any size.
BUCKET_PATHS = ["bucket", "bucket_groups", "bucket_rounds", "bucket_rounds_cluster"]


def _smem_optin():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", fps_capacity.H100_OPTIN)


def _takes(variant, dtype, N):
    return fps_capacity.path_takes(variant, torch.finfo(dtype).bits // 8, N, _smem_optin())


def _grouped_capacity(variant):
    return fps_capacity.grouped_capacity(variant, _smem_optin())


def _skip_unless_path_takes(variant, dtype, N=1):
    if not _takes(variant, dtype, N):
        pytest.skip(f"{variant} does not take {dtype} clouds of {N} points here (tested to refuse)")


@pytest.mark.parametrize("variant", ["simple", "warp", "block", "block_pruned", "cluster", "grid",
                                     "bucket", "bucket_groups", "bucket_rounds",
                                     "bucket_rounds_cluster"])
@pytest.mark.parametrize("case", ["uniform", "ties", "duplicates", "utm"])
@pytest.mark.parametrize("N,npoint", [(1, 1), (7, 9), (33, 33), (255, 100), (257, 257), (1000, 400),
                                      (1024, 1024), (1500, 700), (3001, 700), (4099, 1000),
                                      (8193, 2000), (30001, 600)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_every_path_equals_cpu(cuda, gen, variant, case, N, npoint, dtype):
    """Every CUDA path (simple, several clouds per block, block, cluster, grid) gives the CPU's
    bits on the same inputs, or refuses sizes beyond its documented capacity."""
    xyz, lengths, start = _path_inputs(case, 3, N, gen, dtype)
    cpu = fps_path(xyz, npoint, lengths, start, path="simple")
    takes = _takes(variant, dtype, N)
    if takes is None:
        with pytest.raises(ValueError, match=f"path '{variant}' does not run on CUDA for float64"):
            fps_path(xyz.cuda(), npoint, lengths.cuda(), start.cuda(), path=variant)
        return
    if not takes:
        with pytest.raises(ValueError, match=f"path '{variant}' cannot take these inputs"):
            fps_path(xyz.cuda(), npoint, lengths.cuda(), start.cuda(), path=variant)
        return
    gpu = fps_path(xyz.cuda(), npoint, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.parametrize("variant", ["cluster", "grid", "bucket", "bucket_groups",
                                     "bucket_rounds", "bucket_rounds_cluster"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_large_cloud_paths_equal_cpu(cuda, gen, variant, dtype):
    """A cloud too large for registers (temp in the workspace) on the cluster and grid paths;
    buckets of 64 (float) and 128 (double) points on the bucket paths."""
    _skip_unless_path_takes(variant, dtype)
    xyz = rand_points(2, 150_000, gen, dtype=dtype)
    lengths = torch.tensor([150_000, 99_999])
    start = torch.tensor([7, 99_998])
    cpu = fps_path(xyz, 300, lengths, start, path="tree")
    gpu = fps_path(xyz.cuda(), 300, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.parametrize("variant", ["bucket_groups", "bucket_rounds"])
@pytest.mark.parametrize("N", [300_000, 600_000, 4096 * 256])
def test_cuda_bucket_groups_large_buckets_equal_cpu(cuda, gen, N, variant):
    """bucket_groups / bucket_rounds with 128, 256 and 256 points a bucket (4096 buckets at most,
    fewer where the GPU's shared memory holds fewer), a ragged batch, and the first size past
    their capacity refused."""
    cap = _grouped_capacity(variant)
    if N > cap:
        with pytest.raises(ValueError, match=f"path '{variant}' cannot take these inputs"):
            fps_path(torch.rand(1, N, 3, device="cuda"), 10, path=variant)
        N = cap
    xyz = rand_points(2, N, gen)
    lengths = torch.tensor([N, N // 3 + 1])
    start = torch.tensor([N - 1, 5])
    cpu = fps_path(xyz, 500, lengths, start, path="tree")
    gpu = fps_path(xyz.cuda(), 500, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")
    if N == cap:
        with pytest.raises(ValueError, match=f"path '{variant}' cannot take these inputs"):
            fps_path(torch.rand(1, N + 1, 3, device="cuda"), 10, path=variant)


@pytest.mark.parametrize("N,lengths", [(1_500_000, [1_500_000]), (300_001, [300_001, 77_777, 1])])
def test_cuda_bucket_rounds_cluster_equals_cpu(cuda, gen, N, lengths):
    """bucket_rounds_cluster past one block's 4096 buckets (1.5M points: 8 blocks of 2930
    buckets of 64), and a ragged batch whose short clouds leave blocks of the cluster without
    buckets; the first size past its capacity refused."""
    B = len(lengths)
    xyz = rand_points(B, N, gen)
    lengths = torch.tensor(lengths)
    start = torch.randint(0, N, (B,), generator=gen) % lengths
    cpu = fps_path(xyz, 700, lengths, start, path="tree")
    gpu = fps_path(xyz.cuda(), 700, lengths.cuda(), start.cuda(), path="bucket_rounds_cluster")
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")
    with pytest.raises(ValueError, match="path 'bucket_rounds_cluster' cannot take these inputs"):
        fps_path(torch.rand(1, _grouped_capacity("bucket_rounds_cluster") + 1, 3, device="cuda"),
                 10, path="bucket_rounds_cluster")


def test_cuda_rejects_the_cpu_tree_path(cuda):
    with pytest.raises(ValueError, match="path 'tree' does not run on CUDA"):
        fps_path(torch.rand(1, 10, 3, device="cuda"), 4, path="tree")


@pytest.mark.parametrize("variant", BUCKET_PATHS)
@pytest.mark.parametrize("case", ["huge", "nonfinite", "plane", "line"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_bucket_path_on_degenerate_clouds_equals_cpu(cuda, gen, variant, case, dtype):
    """The bucket path skips buckets by their boxes: squared distances that overflow to +inf,
    NaN and inf coordinates (whose temps stay +inf), flat and collinear clouds (flat boxes)
    must still give the simple path's bits."""
    _skip_unless_path_takes(variant, dtype)
    xyz, lengths, start = _path_inputs(case, 3, 9000, gen, dtype)
    cpu = fps_path(xyz, 2500, lengths, start, path="simple")
    gpu = fps_path(xyz.cuda(), 2500, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.parametrize("case", ["uniform", "ties", "duplicates", "utm", "huge", "blobs",
                                  "nonfinite", "plane", "line"])
@pytest.mark.parametrize("N", [129, 1000, 4096, 8192, 10240, 12288])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_block_pruned_every_sample_equals_cpu(cuda, gen, case, N, dtype):
    """block_pruned (the block path skipping the warps a sample cannot change) sampled down to
    every point: the late steps skip most warps, ties and duplicates meet the skipped warps'
    stale farthest, non-finite points sit outside every box, a plane or a line gives flat
    boxes; ragged lengths and random starts."""
    _skip_unless_path_takes("block_pruned", dtype, N)
    xyz, lengths, start = _path_inputs(case, 3, N, gen, dtype)
    cpu = fps_path(xyz, N, lengths, start, path="simple")
    gpu = fps_path(xyz.cuda(), N, lengths.cuda(), start.cuda(), path="block_pruned")
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


def _pruned_edges(dtype):
    """The cloud sizes each side of every edge of block_pruned's reach on this GPU: where its
    shared memory stops (or, past the registers, starts again) fitting the opt-in limit, and
    where its shapes end (12288 float, 4096 double points)."""
    edges, before = set(), None
    for N in range(1, 12290):
        fits = bool(_takes("block_pruned", dtype, N))
        if before is not None and fits != before:
            edges.update((N - 1, N))
        before = fits
    return sorted(edges)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_block_pruned_at_the_edges_of_shared_memory_runs_or_raises(cuda, gen, dtype):
    """block_pruned forced at the largest sizes this GPU's shared memory takes runs and gives the
    CPU's bits, one point more raises ValueError (never a launch failure); AUTO runs every one
    of those sizes (BLOCK or a bucket path where block_pruned does not fit)."""
    for N in _pruned_edges(dtype):
        xyz, lengths, start = _path_inputs("uniform", 2, N, gen, dtype)
        cpu = fps_path(xyz, 300, lengths, start, path="simple")
        args = (xyz.cuda(), 300, lengths.cuda(), start.cuda())
        if _takes("block_pruned", dtype, N):
            gpu = fps_path(*args, path="block_pruned")
            assert_equal(gpu[0], cpu[0], what=f"idx, N = {N}")
            assert_equal(gpu[1], cpu[1], what=f"dist2, N = {N}")
        else:
            with pytest.raises(ValueError, match="path 'block_pruned' cannot take these inputs"):
                fps_path(*args, path="block_pruned")
        auto = fps_op(*args)
        assert_equal(auto[0], cpu[0], what=f"AUTO idx, N = {N}")
        assert_equal(auto[1], cpu[1], what=f"AUTO dist2, N = {N}")


@pytest.mark.parametrize("variant", BUCKET_PATHS)
def test_cuda_bucket_path_on_real_scans_every_sample(cuda, variant):
    """The real scans, ragged in one batch, sampled down to every point (the late steps, where
    the bucket path skips almost everything, and the tie-breaking among the last points)."""
    import os
    base = os.path.join(os.path.dirname(__file__), "..", ".data", "scans")
    names = ["kitti_velodyne_000000.npy", "nuscenes_lidar_top_1532402927647951.npy"]
    if not all(os.path.exists(os.path.join(base, n)) for n in names):
        pytest.skip("no real scans in .data/scans")
    clouds = [torch.from_numpy(np.load(os.path.join(base, n))[:, :3].astype(np.float32)) for n in names]
    N = max(len(c) for c in clouds)
    xyz = torch.zeros(2, N, 3)
    for b, c in enumerate(clouds):
        xyz[b, :len(c)] = c
    lengths = torch.tensor([len(c) for c in clouds])
    start = torch.tensor([4321, 17])
    npoint = 40_000
    cpu = fps_path(xyz, npoint, lengths, start, path="tree")
    gpu = fps_path(xyz.cuda(), npoint, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.parametrize("case", ["uniform", "ties", "duplicates", "utm", "huge", "blobs"])
@pytest.mark.parametrize("N,npoint", [(31, 31), (1000, 1000), (10_000, 1000), (16_385, 4096),
                                      (40_001, 3000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("variant", BUCKET_PATHS)
def test_cuda_bucket_path_on_every_case_equals_cpu(cuda, gen, variant, case, N, npoint, dtype):
    """The bucket path (the default for clouds past the block path) gives the simple path's bits
    on every input kind, spatial clusters included (dense blobs far apart: most buckets skipped
    at every step, a few updated again and again), with ragged lengths, random starts and N
    not a multiple of a bucket."""
    _skip_unless_path_takes(variant, dtype)
    xyz, lengths, start = _path_inputs(case, 3, N, gen, dtype)
    cpu = fps_path(xyz, npoint, lengths, start, path="simple")
    gpu = fps_path(xyz.cuda(), npoint, lengths.cuda(), start.cuda(), path=variant)
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.sanitizer
@pytest.mark.parametrize("variant", ["simple", "warp", "block", "block_pruned", "cluster", "grid",
                                     "bucket", "bucket_groups", "bucket_rounds",
                                     "bucket_rounds_cluster"])
def test_cuda_sanitizer_every_path(cuda, gen, variant):
    xyz, lengths, start = _path_inputs("duplicates", 3, 700, gen, torch.float32)
    assert_equal(fps_path(xyz.cuda(), 200, lengths.cuda(), start.cuda(), path=variant)[0],
                 fps_path(xyz, 200, lengths, start, path="simple")[0])


@pytest.mark.sanitizer
@pytest.mark.parametrize("variant,N", [("warp", 300), ("block", 1000), ("block", 1500)])
def test_cuda_sanitizer_register_slots(cuda, gen, variant, N):
    """The register paths' slots: two warps a cloud and several clouds a block (warp, 300
    points), 8 slots (block, 1000 points: 8 warps) and 16 (1500 points: 12 warps, 4 slots of
    absent warps), on ragged clouds with duplicates."""
    xyz, lengths, start = _path_inputs("duplicates", 5, N, gen, torch.float32)
    gpu = fps_path(xyz.cuda(), 400, lengths.cuda(), start.cuda(), path=variant)
    cpu = fps_path(xyz, 400, lengths, start, path="simple")
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.sanitizer
def test_cuda_sanitizer_block_pruned_shared_points(cuda, gen):
    """block_pruned past 8192 float points: the points in shared memory over the sort's scratch
    (20 warps), a ragged batch with duplicates."""
    _skip_unless_path_takes("block_pruned", torch.float32, 10_000)
    xyz, lengths, start = _path_inputs("duplicates", 2, 10_000, gen, torch.float32)
    gpu = fps_path(xyz.cuda(), 300, lengths.cuda(), start.cuda(), path="block_pruned")
    cpu = fps_path(xyz, 300, lengths, start, path="simple")
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


@pytest.mark.sanitizer
@pytest.mark.parametrize("variant", ["bucket_groups", "bucket_rounds",
                                     "bucket_rounds_cluster"])
@pytest.mark.parametrize("N", [40_000, 70_000])
def test_cuda_sanitizer_bucket_groups_wide_groups(cuda, gen, N, variant):
    """bucket_groups / bucket_rounds with 4 (40k points) and 8 (70k) buckets a lane, a ragged
    batch with duplicates: the shared lists, the atomics and the read-back under the sanitizers."""
    xyz, lengths, start = _path_inputs("duplicates", 2, N, gen, torch.float32)
    gpu = fps_path(xyz.cuda(), 150, lengths.cuda(), start.cuda(), path=variant)
    cpu = fps_path(xyz, 150, lengths, start, path="tree")
    assert_equal(gpu[0], cpu[0], what="idx")
    assert_equal(gpu[1], cpu[1], what="dist2")


def test_float8_coordinates_are_rejected_naming_the_op():
    xyz = torch.rand(1, 5, 3).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"pcops\.furthest_point_sample: argument 'xyz' must be a floating point tensor \(float32, float64, float16 or bfloat16\)"):
        fps_op(xyz, 2)
