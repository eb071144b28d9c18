"""ball_query and ball_query_dist2 for points of any dimension D: against a NumPy reference with
the kernels' summation order (bit for bit; in float64 it is the float64 brute force), D = 3
through the new path against the 3-D paths, float32 against float64, ragged lengths, the
overflow rule, gradients, bad inputs, opcheck, and CPU vs CUDA bit for bit."""
import numpy as np
import pytest
import torch

import pcops
from helpers import assert_bits, features
from pcops._paths import force

bq_op = torch.ops.pcops.ball_query.default
bq_dist2_op = torch.ops.pcops.ball_query_dist2.default

DIMS = [1, 2, 3, 4, 7, 16, 64, 130, 1024]


def radius_for(query, ref, fraction=0.15):
    """A radius whose ball holds about `fraction` of the refs (the float64 distances' quantile)."""
    d = torch.cdist(query.double().reshape(-1, query.shape[-1]),
                    ref.double().reshape(-1, ref.shape[-1]))
    return float(torch.quantile(d.flatten()[:100000], fraction))


# ---------------------------------------------------------------------------------------------
# reference


def ordered_dist2(q, r):
    """[Lq, L] squared distances in the arrays' precision, summed over d = 0 .. D-1 in order
    from +0, each product and sum rounded on its own (NumPy never fuses): the kernels' order
    (kernels/knn_nd.h); the overflow rule: a finite pair's overflow is the dtype's max, a pair
    with a non-finite point +inf (never inside)."""
    q, r = np.asarray(q), np.asarray(r)
    acc = np.zeros((len(q), len(r)), dtype=q.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for d in range(q.shape[1]):
            diff = q[:, None, d] - r[None, :, d]
            acc = acc + diff * diff
        pair = np.isfinite(q).all(1)[:, None] & np.isfinite(r).all(1)[None, :]
        acc = np.where(pair & ~(acc <= np.finfo(q.dtype).max), np.finfo(q.dtype).max, acc)
    return np.where(pair, acc, np.inf).astype(q.dtype)


def ball_reference(query, ref, radius, S, q_lens=None, r_lens=None):
    """(idx, count, dist2_pt3d, idx_pt3d) of the first S refs in index order with distance
    < radius**2 (computed in float64, rounded once to the dtype): ball_query's layout (empty
    slots repeat the first neighbour, -1 if none) and ball_query_dist2's (-1 / 0)."""
    qn, rn = query.detach().cpu().numpy(), ref.detach().cpu().numpy()
    B, M, N = qn.shape[0], qn.shape[1], rn.shape[1]
    with np.errstate(over="ignore"):  # radius**2 may overflow the dtype: +inf, every ref in
        r2 = np.array(radius * radius, dtype=np.float64).astype(qn.dtype)
    idx = np.full((B, M, S), -1, dtype=np.int64)
    count = np.zeros((B, M), dtype=np.int64)
    d_pt3d = np.zeros((B, M, S), dtype=qn.dtype)
    i_pt3d = np.full((B, M, S), -1, dtype=np.int64)
    for b in range(B):
        Lq = M if q_lens is None else int(q_lens[b])
        L = N if r_lens is None else int(r_lens[b])
        if Lq == 0 or L == 0:
            continue
        d = ordered_dist2(qn[b, :Lq], rn[b, :L])
        for m in range(Lq):
            hits = np.nonzero(d[m] < r2)[0][:S]
            c = len(hits)
            count[b, m] = c
            if c:
                idx[b, m, :c] = hits
                idx[b, m, c:] = hits[0]
                i_pt3d[b, m, :c] = hits
                d_pt3d[b, m, :c] = d[m, hits]
    return (torch.from_numpy(idx), torch.from_numpy(count), torch.from_numpy(d_pt3d),
            torch.from_numpy(i_pt3d))


def check_reference(query, ref, radius, S, q_lens=None, r_lens=None):
    """Both ops against the reference, bit for bit; returns ball_query's (idx, count)."""
    idx, count = bq_op(query, ref, radius, S, q_lens, r_lens)
    d2, i2 = bq_dist2_op(query, ref, radius, S, q_lens, r_lens)
    e_idx, e_count, e_d2, e_i2 = ball_reference(query, ref, radius, S, q_lens, r_lens)
    assert_bits(idx, e_idx, f"ball_query idx (S = {S})")
    assert_bits(count, e_count, f"ball_query count (S = {S})")
    assert_bits(i2, e_i2, f"ball_query_dist2 idx (S = {S})")
    assert_bits(d2, e_d2.to(d2.dtype) if query.dtype in (torch.float16, torch.bfloat16) else e_d2,
                f"ball_query_dist2 dist2 (S = {S})")
    return idx, count


# ---------------------------------------------------------------------------------------------
# CPU results against the reference


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_against_reference(gen, D, dtype):
    B, M, N = 3, 25, 150
    query = features(B, M, D, gen, dtype)
    ref = features(B, N, D, gen, dtype)
    radius = radius_for(query, ref)
    q_lens = torch.tensor([M, 9, 0])
    r_lens = torch.tensor([N, 31, 5])
    for S in (1, 5, 64, 200):
        idx, count = check_reference(query, ref, radius, S, q_lens, r_lens)
        assert (count > 0).any() and (count < min(S, N)).any(), "radius left no variety"
    check_reference(query, ref, radius, 16)  # no lengths


@pytest.mark.parametrize("case", ["uniform", "huge", "nonfinite", "infinite_radius2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dimension_3_matches_the_3d_paths(gen, case, dtype):
    """The new path at D = 3 finds what the 3-D paths find, bit for bit (distances too). The op
    takes its 3-D paths for D = 3, so the new path is reached with a zero coordinate added
    (D = 4), first or last: the same sums for every value >= +0, +inf and the max included.
    The reference at D = 3 agrees too."""
    B, M, N = 2, 60, 700  # the grid path needs some hundreds of refs to be worth it
    query = features(B, M, 3, gen, dtype)
    ref = features(B, N, 3, gen, dtype)
    radius = 0.9
    if case == "huge":  # squared distances overflow in parts of the clouds
        big = 1e20 if dtype == torch.float32 else 1e160
        ref[:, ::7] *= big
        query[:, ::5] *= big
    elif case == "nonfinite":
        ref[0, 3, 1] = float("nan")
        ref[0, 5, 2] = float("inf")
        query[1, 0, 0] = float("-inf")
    elif case == "infinite_radius2":  # radius**2 overflows the dtype: every finite ref inside
        radius = 1e20 if dtype == torch.float32 else 1e160
        ref[:, ::7] *= radius
        ref[0, 9, 0] = float("nan")
    q_lens = torch.tensor([M, 17])
    r_lens = torch.tensor([N, 400])
    zq, zr = torch.zeros(B, M, 1, dtype=dtype), torch.zeros(B, N, 1, dtype=dtype)
    for S in (8, 80):
        d3, i3 = bq_dist2_op(query, ref, radius, S, q_lens, r_lens)
        for path in ("brute", "grid"):
            idx3, cnt3 = force("ball_query", path, query, ref, radius, S, q_lens, r_lens)
            for q4, r4 in ((torch.cat([query, zq], 2), torch.cat([ref, zr], 2)),
                           (torch.cat([zq, query], 2), torch.cat([zr, ref], 2))):
                idx4, cnt4 = bq_op(q4, r4, radius, S, q_lens, r_lens)
                assert_bits(idx4, idx3, f"idx, D = 4 vs the 3-D path '{path}' (S = {S})")
                assert_bits(cnt4, cnt3, f"count, D = 4 vs the 3-D path '{path}'")
                d4, i4 = bq_dist2_op(q4, r4, radius, S, q_lens, r_lens)
                assert_bits(i4, i3, f"ball_query_dist2 idx, D = 4 vs D = 3 (S = {S})")
                assert_bits(d4, d3, f"ball_query_dist2 dist2, D = 4 vs D = 3 (S = {S})")
        check_reference(query, ref, radius, S, q_lens, r_lens)


@pytest.mark.parametrize("D", [1, 2, 4, 7, 16, 64, 130, 1024])
def test_float32_against_float64(gen, D):
    """Refs whose float64 distance is inside / outside the ball by more than the float32
    summation bound ((D + 3) u relatively, u = 2**-24) are inside / outside in float32 too;
    the float64 run is bit for bit the float64 brute force (test above)."""
    B, M, N = 2, 20, 120
    query = features(B, M, D, gen)
    ref = features(B, N, D, gen)
    radius = radius_for(query, ref, 0.3)
    S = N  # every hit kept: the set of refs inside
    d2, idx = bq_dist2_op(query, ref, radius, S)
    exact = ((query.double()[:, :, None, :] - ref.double()[:, None, :, :]) ** 2).sum(-1)
    r2 = float(np.float32(radius * radius))
    inside = torch.zeros(B, M, N + 1, dtype=torch.bool)
    inside.scatter_(2, torch.where(idx < 0, N, idx), True)
    inside = inside[..., :N]
    tol = 2 * (D + 3) * 2.0**-24 * exact
    clear_in = exact < r2 - tol
    clear_out = exact > r2 + tol
    assert (inside | ~clear_in).all(), "a ref clearly inside was not found"
    assert (~inside | ~clear_out).all(), "a ref clearly outside was found"
    got = torch.gather(exact, 2, idx.clamp(min=0))
    assert ((d2.double() - got).abs() <= (D + 3) * 2.0**-24 * got)[idx >= 0].all()


def test_half_inputs(gen):
    query = features(2, 20, 6, gen)
    ref = features(2, 50, 6, gen)
    radius = radius_for(query, ref)
    for dtype in (torch.float16, torch.bfloat16):
        q, r = query.to(dtype), ref.to(dtype)
        idx, count = bq_op(q, r, radius, 10)
        e_idx, e_count = bq_op(q.float(), r.float(), radius, 10)
        assert_bits(idx, e_idx, f"idx ({dtype} computes in float32)")
        assert_bits(count, e_count, f"count ({dtype})")
        d2, i2 = bq_dist2_op(q, r, radius, 10)
        e_d2, e_i2 = bq_dist2_op(q.float(), r.float(), radius, 10)
        assert d2.dtype == dtype
        assert_bits(i2, e_i2, f"ball_query_dist2 idx ({dtype})")
        assert_bits(d2, e_d2.to(dtype), f"ball_query_dist2 dist2 ({dtype})")


def test_wrappers_and_non_contiguous_inputs(gen):
    query = features(2, 9, 30, gen).transpose(1, 2)  # [2, 30, 9], not contiguous
    ref = features(2, 9, 80, gen).transpose(1, 2)
    radius = radius_for(query, ref)
    idx, count = pcops.ball_query(query, ref, radius, 12, return_count=True)
    e_idx, e_count, e_d2, e_i2 = ball_reference(query.contiguous(), ref.contiguous(), radius, 12)
    assert_bits(idx, e_idx, "idx")
    assert_bits(count, e_count, "count")
    d2, i2 = pcops.ball_query_dist2(query, ref, radius, 12)
    assert_bits(i2, e_i2, "ball_query_dist2 idx")
    assert_bits(d2, e_d2, "ball_query_dist2 dist2")


@pytest.mark.parametrize("D", [1, 5, 130])
def test_gradcheck_dist2(device, gen, D):
    query = features(2, 6, D, gen, torch.float64, device).requires_grad_()
    ref = features(2, 15, D, gen, torch.float64, device).requires_grad_()
    radius = radius_for(query.detach(), ref.detach(), 0.4)
    lens = torch.tensor([6, 3], device=device)
    f = lambda q, r: pcops.ball_query_dist2(q, r, radius, 5, lens, None)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (query, ref))
    assert torch.autograd.gradcheck(f, (query, ref), check_forward_ad=True,
                                    check_backward_ad=False, check_undefined_grad=False,
                                    check_batched_grad=False)


# ---------------------------------------------------------------------------------------------
# checks, forced paths, opcheck


def test_bad_inputs_raise():
    q = torch.rand(2, 10, 5)
    r = torch.rand(2, 12, 5)
    cases = [
        ((q, torch.rand(2, 12, 4), 0.5, 4),
         r"argument 'ref' must have 5 \(the point dimension D of 'query'\) in dimension 2"),
        ((torch.rand(2, 10, 0), torch.rand(2, 12, 0), 0.5, 4),
         r"argument 'query' must be a tensor of shape \[B, M, D\] with D >= 1"),
        ((q, r, -1.0, 4), r"argument 'radius'"),
        ((q, r, 0.5, 0), r"argument 'nsample'"),
        ((q, r, 0.5, 4, torch.tensor([11, 1])), r"argument 'query_lengths'"),
    ]
    for op, name in ((bq_op, "ball_query"), (bq_dist2_op, "ball_query_dist2")):
        for args, pattern in cases:
            with pytest.raises(ValueError, match=rf"pcops\.{name}: .*" + pattern):
                op(*args)


def test_forced_paths_with_any_dimension(gen):
    query = features(1, 10, 5, gen)
    ref = features(1, 900, 5, gen)
    radius = radius_for(query, ref)
    i, c = force("ball_query", "brute", query, ref, radius, 16, None, None)
    i0, c0 = bq_op(query, ref, radius, 16)
    assert_bits(i, i0, "idx, forced brute")
    assert_bits(c, c0, "count, forced brute")
    with pytest.raises(ValueError, match="path 'grid' cannot take these inputs"):
        force("ball_query", "grid", query, ref, radius, 16, None, None)


def test_opcheck(device, gen):
    query = features(2, 20, 6, gen, torch.float64, device)
    ref = features(2, 40, 6, gen, torch.float64, device)
    radius = radius_for(query, ref)
    lens = torch.tensor([20, 7], device=device)
    torch.library.opcheck(bq_op, (query, ref, radius, 8))
    torch.library.opcheck(bq_op, (query, ref, radius, 8, lens, lens))
    q, r = query.clone().requires_grad_(), ref.clone().requires_grad_()
    torch.library.opcheck(bq_dist2_op, (q, r, radius, 8, lens, None))


def test_compile(gen):
    query = features(2, 20, 6, gen)
    ref = features(2, 40, 6, gen)
    radius = radius_for(query, ref)
    f = torch.compile(lambda q, r: pcops.ball_query_dist2(q, r, radius, 8), fullgraph=True)
    d, i = f(query, ref)
    e_d, e_i = bq_dist2_op(query, ref, radius, 8)
    assert_bits(i, e_i, "idx under torch.compile")
    assert_bits(d, e_d, "dist2 under torch.compile")


# ---------------------------------------------------------------------------------------------
# CUDA: the same bits as the CPU


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu_bitwise(cuda, gen, D, dtype):
    B, M, N = 3, 70, 300
    query = features(B, M, D, gen, dtype)
    ref = torch.cat([features(B, N // 2, D, gen, dtype)] * 2, 1)  # duplicates
    radius = radius_for(query, ref)
    q_lens = torch.tensor([M, 13, 0])
    r_lens = torch.tensor([N, 40, 3])
    for S in (1, 16, 33, 310):
        args = (radius, S)
        i_cpu, c_cpu = bq_op(query, ref, *args, q_lens, r_lens)
        i_cu, c_cu = bq_op(query.cuda(), ref.cuda(), *args, q_lens.cuda(), r_lens.cuda())
        assert_bits(i_cu, i_cpu, f"idx (S = {S})")
        assert_bits(c_cu, c_cpu, f"count (S = {S})")
        d_cpu, j_cpu = bq_dist2_op(query, ref, *args, q_lens, r_lens)
        d_cu, j_cu = bq_dist2_op(query.cuda(), ref.cuda(), *args, q_lens.cuda(), r_lens.cuda())
        assert_bits(j_cu, j_cpu, f"ball_query_dist2 idx (S = {S})")
        assert_bits(d_cu, d_cpu, f"ball_query_dist2 dist2 (S = {S})")


@pytest.mark.parametrize("case", ["huge", "nonfinite", "infinite_radius2"])
def test_cuda_overflow_rule(cuda, gen, case):
    query = features(2, 30, 9, gen)
    ref = features(2, 200, 9, gen)
    radius = 3.0
    if case == "huge":
        ref[:, ::5] *= 1e20
        query[:, ::3] *= 1e20
    elif case == "nonfinite":
        ref[0, 3, 4] = float("nan")
        ref[0, 0, 8] = float("inf")
        query[1, 2, 0] = float("-inf")
    else:
        radius = 1e20
        ref[:, ::5] *= 1e20
        ref[1, 7, 1] = float("nan")
    for S in (4, 200):
        check_reference(query, ref, radius, S)
        i_cpu, c_cpu = bq_op(query, ref, radius, S)
        i_cu, c_cu = bq_op(query.cuda(), ref.cuda(), radius, S)
        assert_bits(i_cu, i_cpu, f"idx (S = {S})")
        assert_bits(c_cu, c_cpu, f"count (S = {S})")
        d_cpu, j_cpu = bq_dist2_op(query, ref, radius, S)
        d_cu, j_cu = bq_dist2_op(query.cuda(), ref.cuda(), radius, S)
        assert_bits(j_cu, j_cpu, f"ball_query_dist2 idx (S = {S})")
        assert_bits(d_cu, d_cpu, f"ball_query_dist2 dist2 (S = {S})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_dimension_3_matches_the_3d_paths(cuda, gen, dtype):
    """On the GPU too: the new kernel at D = 3 (a zero coordinate added) has the bits of every
    3-D path."""
    query = features(2, 300, 3, gen, dtype).cuda()
    ref = features(2, 20000, 3, gen, dtype).cuda()
    zq = torch.zeros(2, 300, 1, dtype=dtype, device="cuda")
    zr = torch.zeros(2, 20000, 1, dtype=dtype, device="cuda")
    q4, r4 = torch.cat([query, zq], 2), torch.cat([ref, zr], 2)
    for S in (8, 64):  # brute_split and split_sorted take S <= 64
        idx4, cnt4 = bq_op(q4, r4, 0.3, S)
        for path in ("brute", "grid", "brute_split", "split_sorted"):
            idx3, cnt3 = force("ball_query", path, query, ref, 0.3, S, None, None)
            assert_bits(idx4, idx3, f"idx vs the 3-D path '{path}' (S = {S})")
            assert_bits(cnt4, cnt3, f"count vs the 3-D path '{path}' (S = {S})")
        d3, i3 = bq_dist2_op(query, ref, 0.3, S)
        d4, i4 = bq_dist2_op(q4, r4, 0.3, S)
        assert_bits(i4, i3, f"ball_query_dist2 idx (S = {S})")
        assert_bits(d4, d3, f"ball_query_dist2 dist2 (S = {S})")
