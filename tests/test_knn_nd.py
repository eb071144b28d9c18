"""knn for points of any dimension D and the metrics l2 / l1 / cosine: against a NumPy reference
with the kernels' summation order (bit for bit), against float64 (indices where no near-tie,
distances within the float32 rounding bound), ties, ragged lengths, gradients, opcheck, bad
inputs, and CPU vs CUDA bit for bit."""
import numpy as np
import pytest
import torch

import pcops
from helpers import assert_close, assert_equal, features
from pcops._paths import force

knn_op = torch.ops.pcops.knn.default

DIMS = [1, 2, 3, 4, 7, 16, 64, 130, 1024]
METRICS = ["l2", "l1", "cosine"]


# ---------------------------------------------------------------------------------------------
# references


def ordered_distances(q, r, metric):
    """[Lq, L] distances in the arrays' precision, summed over d = 0 .. D-1 in order from +0,
    each product and sum rounded on its own (NumPy never fuses): the kernels' order
    (kernels/knn_nd.h); with the overflow rule: a pair of finite points never gets +inf or NaN
    (the type's largest value instead), a point with a non-finite coordinate always +inf."""
    d = _raw_distances(q, r, metric)
    big = np.finfo(q.dtype).max
    finite = np.isfinite(q).all(1)[:, None] & np.isfinite(r).all(1)[None, :]
    with np.errstate(invalid="ignore"):
        d = np.where(finite & ~(d <= big), big, d)
    return np.where(finite, d, np.inf).astype(q.dtype)


def _raw_distances(q, r, metric):
    dt = q.dtype.type
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        diff = q[:, None, :] - r[None, :, :]
        acc = np.zeros(diff.shape[:2], dtype=q.dtype)
        if metric == "l2":
            for d in range(q.shape[1]):
                acc = acc + diff[..., d] * diff[..., d]
            return acc
        if metric == "l1":
            for d in range(q.shape[1]):
                acc = acc + np.abs(diff[..., d])
            return acc
        na = np.zeros(len(q), dtype=q.dtype)
        nb = np.zeros(len(r), dtype=q.dtype)
        for d in range(q.shape[1]):
            acc = acc + q[:, None, d] * r[None, :, d]
            na = na + q[:, d] * q[:, d]
            nb = nb + r[:, d] * r[:, d]
        den = np.sqrt(na)[:, None] * np.sqrt(nb)[None, :]
        c = acc / den
        out = dt(1) - c
        out = np.where(out < 0, dt(0), out)
        zero = (na[:, None] == 0) | (nb[None, :] == 0)
        return np.where(zero, dt(1), out).astype(q.dtype)


def select(d, k, Lq, L, M):
    """The k smallest (distance, index) of each row of d [Lq, L] below +inf, stable order."""
    dist = np.full((M, k), np.inf, dtype=d.dtype)
    idx = np.full((M, k), -1, dtype=np.int64)
    if Lq == 0 or L == 0:
        return dist, idx
    order = np.argsort(d, axis=1, kind="stable")  # ties in index order; NaN last
    for m in range(Lq):
        chosen = order[m][d[m, order[m]] < np.inf][:k]
        dist[m, : len(chosen)] = d[m, chosen]
        idx[m, : len(chosen)] = chosen
    return dist, idx


def check_bitwise(query, ref, k, dist, idx, metric="l2", q_lens=None, r_lens=None):
    qn = query.detach().cpu().numpy()
    rn = ref.detach().cpu().numpy()
    M = qn.shape[1]
    for b in range(qn.shape[0]):
        Lq = M if q_lens is None else int(q_lens[b])
        L = rn.shape[1] if r_lens is None else int(r_lens[b])
        d = ordered_distances(qn[b, :Lq], rn[b, :L], metric)
        ref_d, ref_i = select(d, k, Lq, L, M)
        assert_equal(idx[b], torch.from_numpy(ref_i), what=f"idx[{b}] (lengths {Lq}, {L})")
        assert_equal(dist[b], torch.from_numpy(ref_d), what=f"dist[{b}]")


# ---------------------------------------------------------------------------------------------
# CPU results against the references


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_against_ordered_reference(gen, D, metric, dtype):
    # N = 150: three tiles of 64 refs; D = 130: three slices of 64 coordinates; k = 40: the heap
    # (k > 32); k = 200: more than the refs
    B, M, N = 3, 21, 150
    query = features(B, M, D, gen, dtype)
    ref = features(B, N, D, gen, dtype)
    q_lens = torch.tensor([M, 7, 0])
    r_lens = torch.tensor([N, 33, 5])
    for k in (1, 5, 40, 200):
        dist, idx = pcops.knn(query, ref, k, q_lens, r_lens, metric=metric)
        assert dist.dtype == dtype and idx.dtype == torch.int64 and dist.shape == (B, M, k)
        check_bitwise(query, ref, k, dist, idx, metric, q_lens, r_lens)


def test_l2_dimension_3_matches_the_3d_paths(gen):
    # the order of any D, at D = 3, is the 3-D paths' formula: the reference of any D agrees
    # with the 3-D op (brute force and grid) bit for bit
    query = features(2, 40, 3, gen)
    ref = features(2, 700, 3, gen)
    for path in ("brute", "grid"):
        dist, idx = force("knn", path, query, ref, 9, None, None)
        check_bitwise(query, ref, 9, dist, idx, "l2")


@pytest.mark.parametrize("D", [1, 2, 4, 7, 16, 64, 130, 1024])
def test_float32_against_float64(gen, D):
    """Indices equal to the float64 brute force's wherever its order has no near-tie; every
    distance within the float32 summation bound of the float64 one."""
    B, M, N, k = 2, 30, 200, 8
    q64 = features(B, M, D, gen, torch.float64)
    r64 = features(B, N, D, gen, torch.float64)
    dist, idx = pcops.knn(q64.float(), r64.float(), k)
    # the float64 distances of the float32 inputs (the inputs are rounded first: that is the
    # op's input, not an error of the op)
    q, r = q64.float().double(), r64.float().double()
    exact = ((q[:, :, None, :] - r[:, None, :, :]) ** 2).sum(-1)  # [B, M, N]
    ex_d, ex_i = exact.sort(dim=-1, stable=True)
    # sequential float32 sum of D terms: each difference, square and sum rounded at most once
    # (unit roundoff u = 2**-24): |err| <= ((D + 2) u + O(u^2)) * exact
    bound = (D + 3) * 2.0**-24 * ex_d[..., : k + 1]
    got = torch.gather(exact, 2, idx)
    assert_close(dist.double(), got, atol=0, rtol=(D + 3) * 2.0**-24, what="dist vs float64")
    gaps = ex_d[..., 1 : k + 1] - ex_d[..., :k]
    clear = (gaps > 2 * (bound[..., 1:] + bound[..., :-1])).all(-1)  # rows with no near-tie
    # at D = 1024 the k nearest of 200 normal points lie close together (about half the rows
    # have a gap within the bound), so the test asks for a fifth of the 60 rows: P(fail) ~ 1e-6
    assert clear.float().mean() > 0.2, "too few rows without near-ties to test"
    assert_equal(idx[clear], ex_i[..., :k][clear], what="idx of rows without near-ties")
    # where near-ties exist, the chosen refs are still among the k nearest up to the bound
    assert (got[..., -1] <= ex_d[..., k - 1] + 2 * bound[..., k - 1]).all()


@pytest.mark.parametrize("D", [1, 4, 64])
@pytest.mark.parametrize("metric", METRICS)
def test_ties_go_to_the_lower_index(gen, D, metric):
    # integer coordinates in a small range, and every ref repeated: many exact ties
    base = torch.randint(-2, 3, (2, 40, D), generator=gen).float()
    ref = torch.cat([base, base, base], 1)  # ref j, j + 40, j + 80 equal
    query = torch.randint(-2, 3, (2, 25, D), generator=gen).float()
    dist, idx = pcops.knn(query, ref, 12, metric=metric)
    check_bitwise(query, ref, 12, dist, idx, metric)
    # equal distances come in ascending index
    same = (dist[..., 1:] == dist[..., :-1]) & (idx[..., 1:] >= 0)
    assert (idx[..., 1:][same] > idx[..., :-1][same]).all()


@pytest.mark.parametrize("metric", METRICS)
def test_non_finite_refs_are_never_neighbours(gen, metric):
    query = features(1, 10, 5, gen)
    ref = features(1, 30, 5, gen)
    ref[0, 3, 2] = float("nan")
    ref[0, 7, 0] = float("inf")
    ref[0, 11] = 3e38  # finite: l2 / l1 sums overflow, and saturate at the float32 maximum
    ref[0, 12] = 3e38
    dist, idx = pcops.knn(query, ref, 30, metric=metric)
    check_bitwise(query, ref, 30, dist, idx, metric)
    for b in (3, 7):
        assert not (idx == b).any()
    assert (idx[..., -2:] == -1).all() and torch.isinf(dist[..., -2:]).all()
    assert torch.isfinite(dist[..., :-2]).all()
    if metric != "cosine":  # 11 and 12 tie at the maximum, in index order, last
        assert (idx[..., -4:-2] == torch.tensor([11, 12])).all()
        assert (dist[..., -4:-2] == torch.finfo(torch.float32).max).all()


def test_unbatched_and_half_inputs(gen):
    query = features(1, 12, 6, gen)
    ref = features(1, 20, 6, gen)
    d2, i2 = pcops.knn(query[0], ref[0], 4)
    d3, i3 = pcops.knn(query, ref, 4)
    assert_equal(d2, d3[0])
    assert_equal(i2, i3[0])
    dh, ih = pcops.knn(query.half(), ref.half(), 4)
    df, i_f = pcops.knn(query.half().float(), ref.half().float(), 4)
    assert dh.dtype == torch.float16
    assert_equal(ih, i_f)
    assert_equal(dh, df.half())


@pytest.mark.parametrize("metric", METRICS)
def test_overflow_rule_half_output(gen, metric):
    # finite float16 points whose distance exceeds the float16 maximum: that maximum, not +inf
    query = (features(1, 6, 4, gen) * 200).half()
    ref = (features(1, 9, 4, gen) * 200).half()
    dist, idx = pcops.knn(query, ref, 9, metric=metric)
    assert dist.dtype == torch.float16 and torch.isfinite(dist).all()
    df, i_f = pcops.knn(query.float(), ref.float(), 9, metric=metric)
    assert_equal(idx, i_f)


def test_cosine_zero_vectors(gen):
    query = features(1, 4, 3, gen)
    ref = features(1, 6, 3, gen)
    ref[0, 2] = 0
    query[0, 1] = 0
    dist, idx = pcops.knn(query, ref, 6, metric="cosine")
    check_bitwise(query, ref, 6, dist, idx, "cosine")
    assert (dist[0, 1] == 1).all()  # a zero query: every distance 1, in index order
    assert_equal(idx[0, 1], torch.arange(6))


# ---------------------------------------------------------------------------------------------
# gradients, opcheck


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("D", [1, 5, 70])
def test_gradcheck_float64(device, gen, metric, D):
    query = features(2, 6, D, gen, torch.float64, device).requires_grad_()
    ref = features(2, 9, D, gen, torch.float64, device).requires_grad_()
    q_lens = torch.tensor([6, 4], device=device)
    r_lens = torch.tensor([9, 3], device=device)  # k > 3: slots with -1 / +inf in cloud 1

    def f(q, r):
        d, _ = pcops.knn(q, r, 5, q_lens, r_lens, metric=metric)
        return torch.where(torch.isfinite(d), d, torch.zeros_like(d))

    torch.autograd.gradcheck(f, (query, ref), check_forward_ad=True)


@pytest.mark.parametrize("metric", METRICS)
def test_backward_matches_dense_autograd(device, gen, metric):
    query = features(2, 15, 9, gen, torch.float64, device).requires_grad_()
    ref = features(2, 20, 9, gen, torch.float64, device).requires_grad_()
    r_lens = torch.tensor([20, 4], device=device)
    dist, idx = pcops.knn(query, ref, 6, None, r_lens, metric=metric)
    g = torch.randn(dist.shape, generator=gen, dtype=torch.float64).to(device)
    g = torch.where(idx >= 0, g, 0.0)
    gq, gr = torch.autograd.grad(torch.where(idx >= 0, dist, 0.0), (query, ref), g)
    # the same distances rebuilt with torch ops from the chosen indices
    nb = torch.gather(ref, 1, idx.clamp(min=0).reshape(2, -1, 1).expand(-1, -1, 9)).reshape(2, 15, 6, 9)
    q = query.unsqueeze(2)
    if metric == "l2":
        dense = ((q - nb) ** 2).sum(-1)
    elif metric == "l1":
        dense = (q - nb).abs().sum(-1)
    else:
        dense = 1 - (q * nb).sum(-1) / (q.norm(dim=-1) * nb.norm(dim=-1))
    eq, er = torch.autograd.grad(torch.where(idx >= 0, dense, 0.0), (query, ref), g)
    assert_close(gq, eq, atol=1e-12, rtol=1e-10, what="grad query")
    assert_close(gr, er, atol=1e-12, rtol=1e-10, what="grad ref")


@pytest.mark.parametrize("metric", METRICS)
def test_opcheck(device, gen, metric):
    query = features(2, 30, 5, gen, torch.float64, device).requires_grad_()
    ref = features(2, 40, 5, gen, torch.float64, device).requires_grad_()
    lens = torch.tensor([30, 11], device=device)
    torch.library.opcheck(knn_op, (query, ref, 5, None, None, metric))
    torch.library.opcheck(knn_op, (query, ref, 50, lens, torch.tensor([40, 3], device=device), metric))
    torch.library.opcheck(knn_op, (query.float()[..., :1], ref.float()[..., :1], 7, None, None, metric))


@pytest.mark.parametrize("metric", METRICS)
def test_vmap_compile_and_func_transforms(gen, metric):
    Q = features(3, 10, 5, gen).reshape(3, 1, 10, 5).expand(3, 2, 10, 5).contiguous()
    R = features(3, 24, 5, gen).reshape(3, 2, 12, 5)
    d, i = torch.vmap(lambda q, r: pcops.knn(q, r, 3, metric=metric))(Q, R)
    for v in range(3):
        dv, iv = pcops.knn(Q[v], R[v], 3, metric=metric)
        assert_equal(d[v], dv)
        assert_equal(i[v], iv)
    f = torch.compile(lambda q, r: pcops.knn(q, r, 3, metric=metric), fullgraph=True,
                      backend="aot_eager")
    dc, ic = f(Q[0], R[0])
    assert_equal(dc, d[0])
    assert_equal(ic, i[0])
    q, r = Q[0].double(), R[0].double()
    jr = torch.func.jacrev(lambda q: pcops.knn(q, r, 3, metric=metric)[0])(q)
    jf = torch.func.jacfwd(lambda q: pcops.knn(q, r, 3, metric=metric)[0])(q)
    assert_close(jr, jf, atol=1e-12, what="jacrev vs jacfwd")


# ---------------------------------------------------------------------------------------------
# the CPU's blocked path (float32 l2, kernels/knn_nd_blocked_cpu.inc) against the brute force:
# the same bits, for a cross kNN and for a self-kNN (query and ref the same tensor: its pairs
# are visited once), whose variant runs with at least 2 clouds per thread


def self_clouds():
    """Enough clouds for the self-kNN variant on this machine's threads."""
    return 2 * torch.get_num_threads() + 1


def blocked_and_brute(query, ref, k, q_lens=None, r_lens=None):
    got = force("knn", "brute_blocked", query, ref, k, q_lens, r_lens)
    want = force("knn", "brute", query, ref, k, q_lens, r_lens)
    for a, b, what in zip(got, want, ("dist", "idx")):
        assert_equal(a, b, what=f"brute_blocked {what} vs brute (k = {k})")
    return got


@pytest.mark.parametrize("D", [d for d in DIMS if d != 3])  # D = 3 l2: the 3-D paths
def test_blocked_path_matches_brute_force(gen, D):
    # N = 150: nine tiles of 16 refs, the last partial; M = 37: blocks of 32 queries, groups of
    # 4, the last short; D = 1024: four slices of 256 coordinates; k = 33: the heap; k = 200:
    # more than the refs
    B = self_clouds()
    query = features(B, 37, D, gen)
    ref = features(B, 150, D, gen)
    lens = torch.randint(0, 151, (B,), generator=gen)
    lens[0], lens[1] = 150, 0
    q_lens = torch.randint(0, 38, (B,), generator=gen)
    for k in (1, 5, 20, 33, 200):
        blocked_and_brute(query, ref, k)
        blocked_and_brute(query, ref, k, q_lens, lens)
        blocked_and_brute(ref, ref, k)  # self-kNN
        blocked_and_brute(ref, ref, k, lens, lens)
        blocked_and_brute(ref, ref.clone(), k, lens, lens)  # the same points, not the same array
    if D <= 130:
        d, i = blocked_and_brute(ref, ref, 20, lens, lens)
        check_bitwise(ref, ref, 20, d, i, "l2", lens, lens)


@pytest.mark.parametrize("D", [1, 4, 64])
def test_blocked_path_ties_go_to_the_lower_index(gen, D):
    # integer coordinates and every point repeated: many exact ties, in rows and in columns
    base = torch.randint(-2, 3, (self_clouds(), 40, D), generator=gen).float()
    x = torch.cat([base, base, base], 1)  # points j, j + 40, j + 80 equal
    for k in (12, 40):
        dist, idx = blocked_and_brute(x, x, k)
        check_bitwise(x, x, k, dist, idx)
        same = (dist[..., 1:] == dist[..., :-1]) & (idx[..., 1:] >= 0)
        assert (idx[..., 1:][same] > idx[..., :-1][same]).all()


def test_blocked_path_non_finite_and_large_norms(gen):
    x = features(self_clouds(), 70, 24, gen)
    x[0, 3, 2] = float("nan")
    x[0, 7, 0] = float("inf")
    x[0, 11] = 3e38  # l2 sums overflow between these and the rest: FLT_MAX, ties in index order
    x[0, 12] = 3e38
    x[1, 20:] *= 1e18  # large finite norms
    for k in (5, 40, 80):
        dist, idx = blocked_and_brute(x, x, k)
        check_bitwise(x, x, k, dist, idx)
        blocked_and_brute(x[:, :30], x, k)
    assert not ((idx[0] == 3) | (idx[0] == 7)).any()


def test_blocked_path_against_float64(gen):
    """Self-kNN through AUTO (the blocked path): indices equal to the float64 brute force's
    wherever it has no near-tie."""
    D, k = 64, 10
    x64 = features(self_clouds(), 120, D, gen, torch.float64)
    x = x64.float()
    dist, idx = pcops.knn(x, x, k)
    e = x.double()
    exact = ((e[:, :, None, :] - e[:, None, :, :]) ** 2).sum(-1)
    ex_d, ex_i = exact.sort(dim=-1, stable=True)
    bound = (D + 3) * 2.0**-24 * ex_d[..., : k + 1]
    assert_close(dist.double(), torch.gather(exact, 2, idx), atol=1e-30,
                 rtol=(D + 3) * 2.0**-24, what="dist vs float64")
    gaps = ex_d[..., 1 : k + 1] - ex_d[..., :k]
    clear = (gaps > 2 * (bound[..., 1:] + bound[..., :-1])).all(-1)
    assert clear.float().mean() > 0.2, "too few rows without near-ties to test"
    assert_equal(idx[clear], ex_i[..., :k][clear], what="idx of rows without near-ties")


def test_blocked_path_refuses_what_it_cannot_take(gen):
    x = features(2, 20, 8, gen)
    with pytest.raises(ValueError, match="path 'brute_blocked' cannot take these inputs"):
        force("knn", "brute_blocked", x[..., :3].contiguous(), x[..., :3].contiguous(), 4)
    with pytest.raises(ValueError, match="path 'brute_blocked'"):  # float32 only
        force("knn", "brute_blocked", x.double(), x.double(), 4)


# ---------------------------------------------------------------------------------------------
# bad inputs


def test_bad_inputs_raise(device):
    q = torch.rand(2, 10, 5, device=device)
    r = torch.rand(2, 12, 5, device=device)
    cases = [
        ((q, torch.rand(2, 12, 4, device=device), 4), ValueError,
         r"argument 'ref' must have 5 \(the point dimension D of 'query'\) in dimension 2"),
        ((torch.rand(2, 10, 0, device=device), torch.rand(2, 12, 0, device=device), 4), ValueError,
         r"argument 'query' must be a tensor of shape \[B, M, D\] with D >= 1"),
        ((q, r, 4, None, None, "l3"), ValueError,
         r"argument 'metric' must be 'l2', 'l1' or 'cosine', got 'l3'"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=r"pcops\.knn: .*" + pattern):
            knn_op(*args)


def test_forced_paths_with_any_dimension(gen):
    query = features(1, 10, 5, gen)
    ref = features(1, 600, 5, gen)
    d, i = force("knn", "brute", query, ref, 4, None, None)
    check_bitwise(query, ref, 4, d, i)
    for path in ("grid", "grid_baseline"):
        with pytest.raises(ValueError, match=f"path '{path}' cannot take these inputs"):
            force("knn", path, query, ref, 4, None, None)


# ---------------------------------------------------------------------------------------------
# CUDA: the same bits as the CPU


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu_bitwise(cuda, gen, D, metric, dtype):
    B, M, N = 3, 70, 300
    query = features(B, M, D, gen, dtype)
    ref = torch.cat([features(B, N // 2, D, gen, dtype)] * 2, 1)  # duplicates: ties
    q_lens = torch.tensor([M, 13, 0])
    r_lens = torch.tensor([N, 40, 3])
    for k in (1, 16, 33, 310):
        d_cpu, i_cpu = pcops.knn(query, ref, k, q_lens, r_lens, metric=metric)
        d_cu, i_cu = pcops.knn(query.cuda(), ref.cuda(), k, q_lens.cuda(), r_lens.cuda(),
                               metric=metric)
        assert_equal(i_cu.cpu(), i_cpu, what=f"idx (k = {k})")
        assert_equal(d_cu.cpu(), d_cpu, what=f"dist (k = {k})")


# ---------------------------------------------------------------------------------------------
# CUDA: the tensor-core shortlist ("tc", kernels/knn_nd/tc.cuh) against the brute force, bit for
# bit. The tc path needs sm_80+; on older GPUs forcing it raises.


def tc_runs():
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("the tc path needs sm_80 or newer")


def check_tc(query, ref, k, q_lens=None, r_lens=None, reference=True):
    """Forced tc == forced brute (CUDA) bit for bit, and (reference) == the ordered NumPy
    reference on the float32 values."""
    qc, rc = query.cuda(), ref.cuda()
    ql = None if q_lens is None else q_lens.cuda()
    rl = None if r_lens is None else r_lens.cuda()
    d_tc, i_tc = force("knn", "tc", qc, rc, k, ql, rl)
    d_br, i_br = force("knn", "brute", qc, rc, k, ql, rl)
    assert_equal(i_tc.cpu(), i_br.cpu(), what=f"tc idx vs brute (k = {k})")
    assert_equal(d_tc.cpu(), d_br.cpu(), what=f"tc dist vs brute (k = {k})")
    if reference:
        check_bitwise(query.float(), ref.float(), k, d_tc.cpu().float(), i_tc.cpu(), "l2",
                      q_lens, r_lens)


@pytest.mark.parametrize("D", [16, 64, 130, 256, 1024])
def test_tc_matches_brute_random(cuda, gen, D):
    tc_runs()
    B, M, N = 3, 70, 300
    query = features(B, M, D, gen)
    ref = features(B, N, D, gen)
    q_lens = torch.tensor([M, 13, 0])
    r_lens = torch.tensor([N, 40, 3])
    for k in (1, 20, 64):
        check_tc(query, ref, k, q_lens, r_lens)
        check_tc(query, ref, k)


@pytest.mark.parametrize("k", [1, 20, 64])
def test_tc_self_knn_dgcnn_sizes(cuda, gen, k):
    # a self-kNN as EdgeConv runs it: several query tiles of 64 and ref tiles of 64
    tc_runs()
    x = features(2, 1000, 64, gen)
    check_tc(x, x, k, reference=False)


def tc_adversarial(kind, gen, D=64, B=2, M=90, N=260):
    x = torch.randn(B, M + N, D, generator=gen, dtype=torch.float64)
    if kind == "sphere":  # many near-ties
        x = x / x.norm(dim=-1, keepdim=True)
    elif kind == "duplicates":  # each ref 4 times, queries among them
        x = torch.cat([x[:, : (M + N) // 4]] * 4, 1)[:, : M + N]
    elif kind == "offset":
        x = x + 1e3
    elif kind == "huge":  # norms above the tc limit (2^100): the brute force's
        x = x * 1e18
    elif kind == "equal":  # every point the same
        x = x[:, :1].expand(B, M + N, D)
    elif kind == "integers":  # exact ties
        x = torch.randint(-2, 3, (B, M + N, D), generator=gen).double()
    elif kind == "relu":  # non-negative, a large common component
        x = torch.relu(x) + 5.0
    x = x.float()
    return x[:, :M].contiguous(), x[:, M:].contiguous()


@pytest.mark.parametrize("kind", ["sphere", "duplicates", "offset", "huge", "equal", "integers",
                                  "relu"])
def test_tc_adversarial_inputs(cuda, gen, kind):
    tc_runs()
    query, ref = tc_adversarial(kind, gen)
    for k in (1, 20, 64):
        check_tc(query, ref, k, None, torch.tensor([260, 100]))


def test_tc_fallback_on_overflowing_shortlists(cuda, gen):
    # all refs equal: every ref is in every shortlist (d~ - e <= tau for all), 260 refs > the
    # capacity 2 (8 KL + 64) for k = 1 (144): every query falls back to the brute force (for
    # k = 64, 384, they fit); half the cloud equal: some fall back, some not
    tc_runs()
    query, ref = tc_adversarial("equal", gen)
    for k in (1, 64):
        check_tc(query, ref, k)
    q, r = tc_adversarial("sphere", gen)
    r[:, :150] = r[:, :1]
    q[:, ::2] = r[:, :1]
    for k in (1, 20):
        check_tc(q, r, k)


def test_tc_non_finite_points(cuda, gen):
    # a non-finite ref sends its cloud to the brute force, a non-finite query itself
    tc_runs()
    query = features(2, 40, 32, gen)
    ref = features(2, 100, 32, gen)
    ref[0, 5, 3] = float("nan")
    ref[0, 9, 0] = float("inf")
    query[1, 7, 2] = float("nan")
    ref[1, 11] = 3e38  # finite, norm overflows: cloud 1 too
    check_tc(query, ref, 20)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tc_half_inputs(cuda, gen, dtype):
    tc_runs()
    query = features(2, 50, 48, gen).to(dtype)
    ref = features(2, 200, 48, gen).to(dtype)
    for k in (1, 20):
        d_tc, i_tc = force("knn", "tc", query.cuda(), ref.cuda(), k, None, None)
        d_br, i_br = force("knn", "brute", query.cuda(), ref.cuda(), k, None, None)
        assert d_tc.dtype == dtype
        assert_equal(i_tc, i_br)
        assert_equal(d_tc, d_br)


def test_tc_refuses_what_it_cannot_take(device, gen):
    q = features(1, 10, 32, gen, device=device)
    r = features(1, 80, 32, gen, device=device)
    refused = [(q.double(), r.double(), 4)] if device == "cuda" else [(q, r, 4)]
    if device == "cuda":
        refused += [(q[..., :8], r[..., :8], 4),  # D < 16
                    (q[..., :3], r[..., :3], 4),  # the 3-D paths
                    (q, r, 65)]  # k > 64
    for args in refused:
        with pytest.raises(ValueError, match="path 'tc' (cannot take these inputs|does not run on)"):
            force("knn", "tc", *args, None, None)
