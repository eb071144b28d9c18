"""The grid path of knn and ball_query (kernels/grid.h) against the brute-force path, bit for bit.

Every case runs the op through each of its paths (pcops._paths.force): the brute force (the
reference, itself checked against NumPy in test_knn.py / test_ball_query.py) and every other
path of the device and dtype.
Indices, distances and counts must be identical: the grid may only skip refs that cannot be in
the result. The inputs are chosen to break a grid: clusters (overfull cells next to empty
ones), degenerate boxes (a plane, a line, identical points: axes of extent 0), exact distance
ties (snapped coordinates), a real lidar scan (dense near the sensor, sparse far out), queries
far outside the refs' box, UTM-sized coordinates, non-finite values, ragged lengths, tiny N.
"""
import os

import numpy as np
import pytest
import torch

from helpers import FLOAT_DTYPES, assert_equal, clustered_points, rand_points, random_lengths

from pcops import _paths as pcops_paths
from pcops._paths import force, paths

knn_op = torch.ops.pcops.knn.default
bq_op = torch.ops.pcops.ball_query.default
# The paths besides the brute force, and the sizes each takes (kernels/knn_paths.h,
# ball_query_paths.h): a forced path outside them raises instead of falling back.
#   kNN: grid, grid_baseline (the grid's AVX2 / SSE2 build on the CPU even where the AVX-512 one
#   runs; the general build on CUDA even where the one-block build applies), brute_heap (CUDA,
#   any k), warp_select (CUDA float32, N <= 1024), grid_select (CUDA float32, k <= 128),
#   grid_batch (CUDA float32, k <= 64).
#   ball query: grid, brute_split and split_sorted (CUDA, nsample <= 64).


def knn_path_takes(path, N, k):
    # brute_blocked (CPU) and tc (CUDA) are paths of D != 3 only: the 3-D clouds here must be
    # refused by them
    return {"warp_select": N <= 1024, "grid_select": k <= 128, "grid_batch": k <= 64,
            "brute_blocked": False, "tc": False}.get(path, True)


def bq_path_takes(path, S):
    return S <= 64 if path in ("brute_split", "split_sorted") else True


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KITTI = os.path.join(ROOT, ".data", "scans", "kitti_velodyne_000000.npy")


# ---------------------------------------------------------------------------------------------
# inputs: each returns a float64 [B, N, 3] tensor (cast by the test)


def blobs(B, N, gen, clusters=6, sigma=0.02):
    centres = torch.rand(B, clusters, 3, generator=gen, dtype=torch.float64)
    which = torch.randint(0, clusters, (B, N), generator=gen)
    pts = torch.gather(centres, 1, which[..., None].expand(B, N, 3))
    return pts + sigma * torch.randn(B, N, 3, generator=gen, dtype=torch.float64)


def plane(B, N, gen):
    x = torch.rand(B, N, 3, generator=gen, dtype=torch.float64)
    x[..., 2] = 0.25
    return x


def line(B, N, gen):
    t = torch.rand(B, N, 1, generator=gen, dtype=torch.float64)
    return torch.cat([t, 0.5 * t + 0.1, torch.full_like(t, -3.0)], dim=-1)


def axis_line(B, N, gen):
    t = torch.rand(B, N, 1, generator=gen, dtype=torch.float64)
    return torch.cat([torch.zeros_like(t), t, torch.zeros_like(t)], dim=-1)


def identical(B, N, gen):
    return torch.full((B, N, 3), 0.3, dtype=torch.float64)


def snapped(B, N, gen):
    return clustered_points(B, N, gen, dtype=torch.float64, clusters=5)


def uniform(B, N, gen):
    return rand_points(B, N, gen, dtype=torch.float64)


def utm(B, N, gen):
    """A 100 m x 100 m x 10 m patch at UTM-sized coordinates."""
    x = torch.rand(B, N, 3, generator=gen, dtype=torch.float64) * torch.tensor([100.0, 100.0, 10.0])
    return x + torch.tensor([512345.0, 5412345.0, 250.0])


def kitti(B, N, gen):
    if not os.path.exists(KITTI):
        pytest.skip(f"{KITTI} missing")
    scan = torch.from_numpy(np.load(KITTI)[:, :3].astype(np.float64))
    pick = torch.stack([torch.randperm(len(scan), generator=gen)[:N] for _ in range(B)])
    return scan[pick]


SHAPES = {
    "uniform": uniform,
    "blobs": blobs,
    "plane": plane,
    "line": line,
    "axis_line": axis_line,
    "identical": identical,
    "snapped": snapped,
    "utm": utm,
    "kitti": kitti,
}


def queries_for(ref, M, gen, where):
    """M queries per cloud: from the refs' own distribution, around the box, or far outside."""
    B = ref.shape[0]
    if where == "same":
        pick = torch.randint(0, ref.shape[1], (B, M), generator=gen)
        q = torch.gather(ref, 1, pick[..., None].expand(B, M, 3))
        return q + 1e-3 * torch.randn(B, M, 3, generator=gen, dtype=torch.float64)
    lo, hi = ref.amin(1, keepdim=True), ref.amax(1, keepdim=True)
    span = (hi - lo).clamp_min(1.0)
    scale = 1.5 if where == "around" else 40.0
    u = torch.rand(B, M, 3, generator=gen, dtype=torch.float64) * 2 - 1
    return (lo + hi) / 2 + u * span * scale


def check_knn(query, ref, k, ql=None, rl=None):
    d1, i1 = force("knn", "brute", query, ref, k, ql, rl)
    for path in paths("knn", query.device.type, query.dtype):
        if path == "brute":
            continue
        if not knn_path_takes(path, ref.shape[1], k):
            with pytest.raises(ValueError, match=f"path '{path}' cannot take these inputs"):
                force("knn", path, query, ref, k, ql, rl)
            continue
        d2, i2 = force("knn", path, query, ref, k, ql, rl)
        assert_equal(i2, i1, what=f"{path} idx vs brute force")
        assert_equal(d2, d1, what=f"{path} dist2 vs brute force")
        assert torch.equal(d2.isinf(), d1.isinf())
    return d1, i1


def check_bq(query, ref, radius, S, ql=None, rl=None):
    i1, c1 = force("ball_query", "brute", query, ref, radius, S, ql, rl)
    for path in paths("ball_query", query.device.type, query.dtype):
        if path == "brute":
            continue
        if not bq_path_takes(path, S):
            with pytest.raises(ValueError, match=f"path '{path}' cannot take these inputs"):
                force("ball_query", path, query, ref, radius, S, ql, rl)
            continue
        i2, c2 = force("ball_query", path, query, ref, radius, S, ql, rl)
        assert_equal(i2, i1, what=f"{path} idx vs brute force")
        assert_equal(c2, c1, what=f"{path} count vs brute force")
    return i1, c1


# ---------------------------------------------------------------------------------------------
# kNN


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("where", ["same", "around", "far"])
def test_knn_grid_matches_brute(device, gen, shape, where):
    ref = SHAPES[shape](2, 1500, gen)
    query = queries_for(ref, 300, gen, where)
    for dtype in (torch.float32, torch.float64):
        q, r = query.to(dtype).to(device), ref.to(dtype).to(device)
        for k in (1, 8, 16, 50):
            d, i = check_knn(q, r, k)
            if shape not in ("identical",) and where == "same":
                assert (i[..., 0] >= 0).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_knn_grid_dtypes_and_ragged(device, gen, dtype):
    ref = blobs(3, 2000, gen).to(dtype).to(device)
    query = queries_for(blobs(3, 2000, gen), 400, gen, "around").to(dtype).to(device)
    ql = random_lengths(3, 400, gen, device=device)
    rl = random_lengths(3, 2000, gen, device=device)
    for k in (4, 16, 33, 100):
        check_knn(query, ref, k, ql, rl)
        check_knn(query, ref, k, None, rl)


def test_knn_grid_ties(device, gen):
    """Snapped coordinates: many refs at exactly the k-th distance, in different cells; the
    lower indices must win as in the brute force."""
    ref = snapped(2, 3000, gen).to(device)
    query = snapped(2, 500, gen).to(device)
    for k in (1, 7, 16, 40):
        check_knn(query.float(), ref.float(), k)
        check_knn(query, ref, k)


def test_knn_grid_list_kinds(device, gen):
    """The CPU grid path keeps float32 lists of up to 64 (KNN_GRID_SORTED_MAX) sorted by
    insertion and uses the heap above; both sides of the threshold, with ties and clusters."""
    for ref, query in ((snapped(2, 3000, gen), snapped(2, 400, gen)),
                       (blobs(2, 3000, gen), queries_for(blobs(2, 3000, gen), 400, gen, "around"))):
        for k in (63, 64, 65):
            check_knn(query.float().to(device), ref.float().to(device), k)
            check_knn(query.to(device), ref.to(device), k)


def test_knn_grid_tiny_and_large_k(device, gen):
    for N in (0, 1, 2, 5, 17):
        ref = uniform(2, N, gen).float().to(device)
        query = uniform(2, 9, gen).float().to(device)
        for k in (1, 3, 20):
            check_knn(query, ref, k)
    ref = uniform(1, 700, gen).to(device)
    query = uniform(1, 50, gen).to(device)
    for k in (128, 699, 700, 701, 1000):
        check_knn(query, ref, k)
    check_knn(query[:, :0], ref, 4)


def test_knn_grid_non_finite(device, gen):
    """Refs with NaN / inf coordinates are never neighbours; NaN / inf queries have none; refs
    whose squared distance overflows to +inf are never neighbours either."""
    ref = uniform(2, 1200, gen)
    ref[0, 5] = float("nan")
    ref[0, 17, 1] = float("inf")
    ref[1, 3, 2] = -float("inf")
    ref[1, 100] = torch.tensor([3e38, 0.0, 0.0], dtype=torch.float64)
    query = uniform(2, 100, gen)
    query[0, 0, 0] = float("nan")
    query[1, 1, 2] = float("inf")
    for k in (4, 16):
        check_knn(query.float().to(device), ref.float().to(device), k)
        check_knn(query.to(device), ref.to(device), k)
    nan_ref = torch.full((1, 600, 3), float("nan"), dtype=torch.float64)
    check_knn(query[:1].to(device), nan_ref.to(device), 3)


def test_knn_grid_kitti_full(gen):
    """The full KITTI scan against itself on the CPU (all 115 384 points; a subset of queries
    for the brute-force reference)."""
    if not os.path.exists(KITTI):
        pytest.skip(f"{KITTI} missing")
    scan = torch.from_numpy(np.load(KITTI)[:, :3].astype(np.float32))[None]
    pick = torch.randperm(scan.shape[1], generator=gen)[:2000]
    q = torch.cat([scan[:, pick], scan[:, pick] * 3.0], dim=1)  # also far, sparse queries
    check_knn(q, scan, 16)
    (d, i) = force("knn", "grid", scan, scan, 16, None, None)
    assert (i[0, :, 0] >= 0).all()
    assert_equal(d[0, pick], force("knn", "brute", scan[:, pick], scan, 16, None, None)[0][0], what="dist2")


@pytest.mark.parametrize("shape", ["uniform", "blobs", "kitti", "utm"])
def test_knn_grid_self_search(device, gen, shape):
    """The queries are the refs themselves (one cloud, the same tensor and lengths): the CUDA
    path reuses the refs' cell order for the queries instead of sorting them again."""
    N = 30000 if device == "cuda" else 6000
    ref = SHAPES[shape](1, N, gen)
    ref[0, 7] = float("nan")
    ref[0, 11, 2] = float("inf")
    for dtype in (torch.float32, torch.float64):
        r = ref.to(dtype).to(device)
        for k in (1, 16, 64, 65):
            check_knn(r, r, k)
        lens = torch.tensor([N // 2], device=device)
        check_knn(r, r, 16, lens, lens)
        check_knn(r, r, 16, lens, None)
        check_knn(r, r.clone(), 16)


def test_knn_grid_box_many_blocks(cuda, gen):
    """Clouds large enough that several blocks reduce each box (and ragged, and empty)."""
    ref = torch.cat([blobs(3, 20000, gen), uniform(3, 20000, gen) * 50.0 - 7.0], 1)
    ref = ref[:, torch.randperm(40000, generator=gen)]
    query = queries_for(ref, 3000, gen, "around")
    rl = torch.tensor([40000, 5000, 0], device="cuda")
    ql = torch.tensor([3000, 3000, 17], device="cuda")
    for dtype in (torch.float32, torch.float64):
        q, r = query.to(dtype).cuda(), ref.to(dtype).cuda()
        for k in (8, 16):
            check_knn(q, r, k, ql, rl)
        check_bq(q, r, 0.5, 32, ql, rl)


@pytest.mark.sanitizer
def test_grid_cuda_small_for_sanitizer(cuda, gen):
    """The grid paths forced on small clouds (two box blocks a cloud, ragged lengths, the
    self-search order, the heap list) under compute-sanitizer."""
    ref = blobs(2, 5000, gen).float().cuda()
    query = queries_for(blobs(2, 5000, gen), 300, gen, "around").float().cuda()
    rl = torch.tensor([5000, 700], device="cuda")
    ql = torch.tensor([300, 41], device="cuda")
    for k in (16, 65):
        check_knn(query, ref, k, ql, rl)
    one = ref[:1].contiguous()
    check_knn(one, one, 16)
    check_bq(query, ref, 0.05, 32, ql, rl)


# ---------------------------------------------------------------------------------------------
# ball query


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("where", ["same", "around", "far"])
def test_ball_query_grid_matches_brute(device, gen, shape, where):
    ref = SHAPES[shape](2, 1500, gen)
    query = queries_for(ref, 300, gen, where)
    span = float((ref.amax(1) - ref.amin(1)).max().clamp_min(1e-3))
    for dtype in (torch.float32, torch.float64):
        q, r = query.to(dtype).to(device), ref.to(dtype).to(device)
        for frac, S in ((0.02, 8), (0.1, 32), (0.3, 64), (3.0, 5)):
            check_bq(q, r, frac * span, S)
    if where == "far":
        check_bq(query.to(device), ref.to(device), 100.0 * span, 16)  # a radius reaching the box


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_ball_query_grid_dtypes_and_ragged(device, gen, dtype):
    ref = blobs(3, 2000, gen).to(dtype).to(device)
    query = queries_for(blobs(3, 2000, gen), 400, gen, "around").to(dtype).to(device)
    ql = random_lengths(3, 400, gen, device=device)
    rl = random_lengths(3, 2000, gen, device=device)
    for radius, S in ((0.01, 4), (0.05, 32), (0.2, 64)):
        check_bq(query, ref, radius, S, ql, rl)
        check_bq(query, ref, radius, S, None, rl)


def test_ball_query_grid_boundary_and_ties(device, gen):
    """Snapped coordinates with radii equal to lattice distances: refs exactly on the sphere
    (d == r2, not neighbours) next to refs just inside."""
    ref = snapped(2, 3000, gen).to(device)
    query = snapped(2, 400, gen).to(device)
    for radius in (0.2, 0.2 * 2**0.5, 0.4, 0.2 + 1e-9):
        check_bq(query.float(), ref.float(), radius, 32)
        check_bq(query, ref, radius, 32)


def test_ball_query_grid_tiny_and_non_finite(device, gen):
    for N in (0, 1, 3, 40):
        ref = uniform(2, N, gen).to(device)
        check_bq(uniform(2, 7, gen).to(device), ref, 0.5, 4)
    ref = uniform(2, 1200, gen)
    ref[0, 5] = float("nan")
    ref[1, 3, 2] = float("inf")
    query = uniform(2, 100, gen)
    query[0, 0, 0] = float("nan")
    check_bq(query.float().to(device), ref.float().to(device), 0.1, 16)
    check_bq(query.to(device), ref.to(device), 1e30, 16)  # radius**2 overflows float32


def test_ball_query_grid_kitti_full(gen):
    if not os.path.exists(KITTI):
        pytest.skip(f"{KITTI} missing")
    scan = torch.from_numpy(np.load(KITTI)[:, :3].astype(np.float32))[None]
    pick = torch.randperm(scan.shape[1], generator=gen)[:3000]
    check_bq(scan[:, pick], scan, 0.5, 32)
    check_bq(scan[:, pick] * 2.0, scan, 2.0, 64)


# ---------------------------------------------------------------------------------------------
# op-level: opcheck of the forced paths, bad paths, CPU vs CUDA, graph capture


def test_opcheck_paths(device, gen):
    query = uniform(2, 60, gen).to(device)
    ref = uniform(2, 700, gen).to(device)
    lens = torch.tensor([60, 11], device=device)
    for path in ("auto",) + paths("knn", device, query.dtype):
        if not knn_path_takes(path, 700, 5):
            continue
        torch.library.opcheck(torch.ops.pcops._knn_path.default,
                              (query, ref, 5, lens, None, pcops_paths.PATHS["knn"][path][0]))
    for path in ("auto",) + paths("ball_query", device, query.dtype):
        torch.library.opcheck(torch.ops.pcops._ball_query_path.default,
                              (query, ref, 0.2, 8, lens, None, pcops_paths.PATHS["ball_query"][path][0]))


def test_bad_path(device, gen):
    q = uniform(1, 4, gen).to(device)
    with pytest.raises(ValueError, match=r"pcops\._knn_path: argument 'path' must be a path id of knn"):
        torch.ops.pcops._knn_path(q, q, 2, None, None, 99)
    with pytest.raises(ValueError, match=r"pcops\._ball_query_path: argument 'path' must be a path id"):
        torch.ops.pcops._ball_query_path(q, q, 0.1, 2, None, None, -1)
    other = "cuda" if device == "cpu" else "cpu"
    for path in set(paths("knn", other)) - set(paths("knn", device)):
        with pytest.raises(ValueError, match=f"path '{path}' does not run on"):
            force("knn", path, q, q, 2)
    for path in set(paths("ball_query", other)) - set(paths("ball_query", device)):
        with pytest.raises(ValueError, match=f"path '{path}' does not run on"):
            force("ball_query", path, q, q, 0.1, 2)
    if device == "cuda":
        with pytest.raises(ValueError, match="path 'warp_select' does not run on CUDA for float64"):
            force("knn", "warp_select", q.double(), q.double(), 2)
    with pytest.raises(ValueError, match="no path 'nope' of op 'knn'"):
        force("knn", "nope", q, q, 2)


@pytest.mark.parametrize("shape", ["uniform", "blobs", "plane", "kitti", "utm"])
def test_grid_cpu_matches_cuda(cuda, gen, shape):
    ref = SHAPES[shape](2, 5000, gen)
    query = queries_for(ref, 1000, gen, "around")
    span = float((ref.amax(1) - ref.amin(1)).max().clamp_min(1e-3))
    for dtype in (torch.float32, torch.float64):
        q, r = query.to(dtype), ref.to(dtype)
        for k in (1, 16, 64, 100):
            dc, ic = force("knn", "grid", q, r, k, None, None)
            dg, ig = force("knn", "grid", q.cuda(), r.cuda(), k, None, None)
            assert_equal(ig, ic, what=f"CUDA vs CPU idx k={k}")
            assert_equal(dg, dc, what=f"CUDA vs CPU dist2 k={k}")
        for frac, S in ((0.02, 16), (0.1, 64)):
            ic, cc = force("ball_query", "grid", q, r, frac * span, S, None, None)
            ig, cg = force("ball_query", "grid", q.cuda(), r.cuda(), frac * span, S, None, None)
            assert_equal(ig, ic, what="CUDA vs CPU ball idx")
            assert_equal(cg, cc, what="CUDA vs CPU ball count")


def test_grid_cuda_graph_capture(cuda, gen):
    """The grid paths launch with no host synchronisation: capture, replay on new data."""
    query = uniform(4, 2048, gen).float().cuda()
    ref = blobs(4, 4096, gen).float().cuda()
    rl = torch.tensor([4096, 100, 0, 3000], device="cuda")
    for _ in range(2):  # warm-up outside the capture
        force("knn", "grid", query, ref, 16, None, rl)
        force("knn", "grid_select", query, ref, 40, None, rl)
        force("knn", "grid_batch", query, ref, 16, None, rl)
        force("ball_query", "grid", query, ref, 0.05, 32, None, rl)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d, i = force("knn", "grid", query, ref, 16, None, rl)
        ds, is_ = force("knn", "grid_select", query, ref, 40, None, rl)
        db, ib = force("knn", "grid_batch", query, ref, 16, None, rl)
        bi, bc = force("ball_query", "grid", query, ref, 0.05, 32, None, rl)
    query.copy_(uniform(4, 2048, gen).float().cuda())
    ref.copy_(blobs(4, 4096, gen).float().cuda())
    graph.replay()
    torch.cuda.synchronize()
    de, ie = force("knn", "brute", query, ref, 16, None, rl)
    be, ce = force("ball_query", "brute", query, ref, 0.05, 32, None, rl)
    assert_equal(i, ie)
    assert_equal(d, de)
    assert_equal(ib, ie)
    assert_equal(db, de)
    dse, ise = force("knn", "brute", query, ref, 40, None, rl)
    assert_equal(is_, ise)
    assert_equal(ds, dse)
    assert_equal(bi, be)
    assert_equal(bc, ce)
