"""The overflow rule (kernels/geometry.h, README "Ops"): a valid neighbour is never reported as
empty and never with a dist2 that means empty.

Two points with finite coordinates have a finite squared distance: where the sum overflows it
is the compute dtype's largest finite value (FLT_MAX, DBL_MAX), and a float16 / bfloat16 output
too large for its type is that type's largest finite value; +inf keeps meaning "empty slot".
So with finite coordinates and k <= valid refs, kNN returns k valid indices, ordered by
(dist2, idx) with the saturated ones tied at the maximum in index order; ball query counts
them inside exactly when radius**2 itself overflows to +inf; FPS runs its greedy rule on the
saturated distances. Every path of every op, on every device, returns the reference's bits.
"""
import numpy as np
import pytest
import torch

from helpers import assert_equal, dist2_saturated, to_dist_dtype
from pcops._paths import force, paths

knn_op = torch.ops.pcops.knn.default
ball_query_dist2_op = torch.ops.pcops.ball_query_dist2.default

# coordinate scales near each dtype's overflow: the squared distances of far points overflow
# the compute dtype (float32 for float32, float16 and bfloat16 inputs; float64 for float64), or,
# for float16, only the float16 output
SCALES = {
    torch.float16: [300.0, 6e4],
    torch.bfloat16: [1e19, 1e20, 1e38],
    torch.float32: [1e19, 1e20, 1e38, 3e38],  # 3e38: the differences themselves overflow
    torch.float64: [1e154, 1e300, 1.7e308],
}
CASES = [(dtype, scale) for dtype, scales in SCALES.items() for scale in scales]


def overflow_cloud(B, N, gen, dtype, scale):
    """B clouds of N points in [-scale, scale]^3, a third of them shrunk by 1e-3 (so that near
    pairs keep finite distances beside saturated far ones) and a few duplicated (exact ties
    among the finite distances)."""
    x = (torch.rand(B, N, 3, generator=gen, dtype=torch.float64) * 2 - 1) * scale
    near = torch.rand(B, N, generator=gen) < 1 / 3
    x[near] *= 1e-3
    if N >= 8:
        x[:, N - 3 :] = x[:, :3]
    return x.to(dtype)


def compute_numpy(t):
    """t in the ops' compute precision as a NumPy array (float64 stays, the rest is float32)."""
    return t.cpu().to(torch.float64 if t.dtype == torch.float64 else torch.float32).numpy()


def runnable(op, path, *args):
    """force(op, path, *args), or None when the forced path cannot take these sizes."""
    try:
        return force(op, path, *args)
    except ValueError as e:
        if "cannot take these inputs" in str(e):
            return None
        raise


# ---------------------------------------------------------------------------------------------
# references


def knn_reference(query, ref, k, dtype):
    """kNN of one cloud on saturated distances: the valid refs with d < +inf ordered by (d,
    index), then -1 / +inf. Returns (dist2 [M, k] in `dtype`, idx [M, k])."""
    d = dist2_saturated(query, ref)
    M = len(query)
    dist2 = np.full((M, k), np.inf, dtype=d.dtype)
    idx = np.full((M, k), -1, dtype=np.int64)
    order = np.argsort(d, axis=1, kind="stable")  # ties in index order
    for m in range(M):
        chosen = order[m][d[m, order[m]] < np.inf][:k]
        dist2[m, : len(chosen)] = d[m, chosen]
        idx[m, : len(chosen)] = chosen
    return to_dist_dtype(torch.from_numpy(dist2), dtype), torch.from_numpy(idx)


def ball_query_reference(query, ref, radius, nsample, dtype):
    """The first nsample refs in index order with saturated d < (T)radius**2; dist2 / idx in
    ball_query_dist2's layout (empty slots 0 / -1) and the count."""
    d = dist2_saturated(query, ref)
    with np.errstate(over="ignore"):
        r2 = d.dtype.type(radius * radius)  # radius**2 in float64, rounded once (+inf past the max)
    M = len(query)
    dist2 = np.zeros((M, nsample), dtype=d.dtype)
    idx = np.full((M, nsample), -1, dtype=np.int64)
    count = np.zeros(M, dtype=np.int64)
    for m in range(M):
        hits = np.nonzero(d[m] < r2)[0][:nsample]
        count[m] = len(hits)
        idx[m, : len(hits)] = hits
        dist2[m, : len(hits)] = d[m, hits]
    return to_dist_dtype(torch.from_numpy(dist2), dtype), torch.from_numpy(idx), torch.from_numpy(count)


def fps_reference(xyz, npoint, dtype):
    """Greedy FPS from point 0 on saturated distances, ties to the lowest index."""
    L = len(xyz)
    idx = np.full(npoint, -1, dtype=np.int64)
    dist2 = np.zeros(npoint, dtype=xyz.dtype)
    temp = np.full(L, np.inf, dtype=xyz.dtype)
    cur = 0
    idx[0] = 0
    for j in range(1, min(npoint, L)):
        temp[cur] = -1
        d = dist2_saturated(xyz, xyz[cur : cur + 1])[:, 0]
        temp = np.where(d < temp, d, temp)
        cur = int(np.argmax(temp))
        idx[j] = cur
        dist2[j] = temp[cur]
    return torch.from_numpy(idx), to_dist_dtype(torch.from_numpy(dist2), dtype)


# ---------------------------------------------------------------------------------------------
# the two examples


def test_half_knn_neighbour_beyond_the_half_range_is_not_empty(device):
    query = torch.zeros(1, 1, 3, dtype=torch.float16, device=device)
    ref = torch.tensor([[[300.0, 0, 0]]], dtype=torch.float16, device=device)
    dist2, idx = knn_op(query, ref, 1)
    assert idx.item() == 0
    assert dist2.item() == torch.finfo(torch.float16).max, f"dist2 {dist2.item()} (+inf means empty)"


def test_float32_knn_near_1e20_returns_k_valid_indices(device, gen):
    B, N, k = 8, 64, 8
    xyz = ((torch.rand(B, N, 3, generator=gen, dtype=torch.float64) * 2 - 1) * 1e20).float()
    dist2, idx = knn_op(xyz.to(device), xyz.to(device), k)
    assert (idx >= 0).all(), f"{int((idx < 0).sum())} of {idx.numel()} slots empty"
    assert torch.isfinite(dist2).all()


# ---------------------------------------------------------------------------------------------
# every path against the references


@pytest.mark.parametrize("dtype,scale", CASES)
@pytest.mark.parametrize("M,N", [(20, 64), (40, 600)])
def test_knn_every_path_keeps_saturated_neighbours(device, gen, dtype, scale, M, N):
    B = 2
    query = overflow_cloud(B, M, gen, dtype, scale)
    ref = overflow_cloud(B, N, gen, dtype, scale)
    ran = 0
    for path in paths("knn", device, dtype):
        for k in (1, 8, 64, N + 3):
            out = runnable("knn", path, query.to(device), ref.to(device), k)
            if out is None:
                continue
            dist2, idx = out
            ran += 1
            n = min(k, N)
            assert (idx[..., :n] >= 0).all(), f"{path}, k={k}: a valid neighbour reported as empty"
            assert torch.isfinite(dist2[..., :n]).all(), f"{path}, k={k}: a neighbour with dist2 +inf"
            for b in range(B):
                ref_d, ref_i = knn_reference(compute_numpy(query[b]), compute_numpy(ref[b]), k, dtype)
                assert_equal(idx[b].cpu(), ref_i, what=f"idx[{b}], path {path}, k={k}")
                assert_equal(dist2[b].cpu(), ref_d, what=f"dist2[{b}], path {path}, k={k}")
    assert ran > 0


@pytest.mark.parametrize("dtype,scale", CASES)
@pytest.mark.parametrize("M,N", [(20, 64), (40, 600)])
def test_ball_query_every_path_on_saturated_distances(device, gen, dtype, scale, M, N):
    """A finite radius leaves the saturated refs outside; a radius whose square overflows the
    compute dtype takes every finite ref."""
    B, S = 2, 16
    query = overflow_cloud(B, M, gen, dtype, scale)
    ref = overflow_cloud(B, N, gen, dtype, scale)
    compute_max = float(np.finfo(np.float64 if dtype == torch.float64 else np.float32).max)
    radii = (scale * 2e-3, scale, 1.5 * compute_max**0.5)  # the last: radius**2 overflows
    ran = 0
    for radius in radii:
        for b in range(B):
            ref_d, ref_i, ref_c = ball_query_reference(compute_numpy(query[b]), compute_numpy(ref[b]),
                                                       radius, S, dtype)
            if radius > compute_max**0.5:
                assert (ref_c == S).all()
            for path in paths("ball_query", device, dtype):
                out = runnable("ball_query", path, query[b : b + 1].to(device), ref[b : b + 1].to(device),
                               radius, S)
                if out is None:
                    continue
                idx, count = out
                ran += 1
                first = torch.where(ref_c > 0, ref_i[:, 0], -1)[:, None]
                want = torch.where(ref_i >= 0, ref_i, first)  # empty slots repeat the first hit
                assert_equal(idx[0].cpu(), want, what=f"idx[{b}], path {path}, radius {radius:g}")
                assert_equal(count[0].cpu(), ref_c, what=f"count[{b}], path {path}, radius {radius:g}")
            qb, rb = query[b : b + 1].to(device), ref[b : b + 1].to(device)
            dist2, idx = ball_query_dist2_op(qb, rb, radius, S)
            assert_equal(idx[0].cpu(), ref_i, what=f"ball_query_dist2 idx[{b}], radius {radius:g}")
            assert_equal(dist2[0].cpu(), ref_d, what=f"ball_query_dist2 dist2[{b}], radius {radius:g}")
    assert ran > 0


@pytest.mark.parametrize("dtype,scale", CASES)
@pytest.mark.parametrize("N", [64, 600, 5000])
def test_fps_every_path_on_saturated_distances(device, gen, dtype, scale, N):
    B = 2
    xyz = overflow_cloud(B, N, gen, dtype, scale)
    npoint = min(N, 200)
    start = torch.zeros(B, dtype=torch.int64)
    ran = 0
    for path in paths("furthest_point_sample", device, dtype):
        out = runnable("furthest_point_sample", path, xyz.to(device), npoint, None, start.to(device))
        if out is None:
            continue
        idx, dist2 = out
        ran += 1
        assert torch.isfinite(dist2).all(), f"{path}: a sample's dist2 is not finite"
        for b in range(B):
            ref_i, ref_d = fps_reference(compute_numpy(xyz[b]), npoint, dtype)
            assert_equal(idx[b].cpu(), ref_i, what=f"idx[{b}], path {path}")
            assert_equal(dist2[b].cpu(), ref_d, what=f"dist2[{b}], path {path}")
            assert len(set(idx[b].tolist())) == npoint
    assert ran > 0


def test_non_finite_points_stay_out_when_others_saturate(device):
    """The rule is for finite coordinates: an infinite or NaN coordinate is still never a
    neighbour (its distance stays +inf or NaN), next to refs whose distance saturates."""
    big = 3e38
    ref = torch.tensor([[[big, 0, 0], [float("inf"), 0, 0], [-big, 0, 0], [float("nan"), 0, 0],
                         [0, big, 0]]])
    query = torch.tensor([[[-big, -big, 0], [float("inf"), 0, 0]]])
    for path in paths("knn", device, torch.float32):
        out = runnable("knn", path, query.to(device), ref.to(device), 5)
        if out is None:
            continue
        dist2, idx = out
        assert_equal(idx[0, 0].cpu(), torch.tensor([0, 2, 4, -1, -1]), what=f"idx, path {path}")
        assert (dist2[0, 0, :3] == torch.finfo(torch.float32).max).all(), "saturated: tied, in index order"
        assert (idx[0, 1] == -1).all(), "an infinite query has no neighbours"
