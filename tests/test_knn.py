"""knn: against independent NumPy references, properties, dtypes, gradients, bad inputs, CUDA."""
import numpy as np
import pytest
import torch

import pcops
from helpers import (FLOAT_DTYPES, assert_close, assert_equal, clustered_points, dist2_saturated, rand_points,
                     random_lengths)
from pcops._paths import force

knn_op = torch.ops.pcops.knn.default

# k values that reach every CUDA selection path: register buckets 1, 4, 8, 16, 32, 64 (each at
# its edge and inside it), the shared-memory heap (k > 64) and k above the number of refs.
BUCKET_KS = [1, 2, 4, 5, 8, 9, 16, 17, 31, 32, 33, 64, 65, 128, 200]


# ---------------------------------------------------------------------------------------------
# references


def knn_reference(query, ref, k, q_len=None, r_len=None):
    """Brute-force kNN of one cloud, written for clarity, in the arrays' own precision (float32
    or float64) with the contract's formula d = (dx*dx + dy*dy) + dz*dz, an overflow between
    finite points saturated (helpers.dist2_saturated). The candidates are the valid refs with
    d < +inf, ordered by (d, index) through a stable argsort. Returns dist2 [M, k] and idx
    [M, k], with -1 / +inf in empty slots and in the rows of invalid queries."""
    q, r = np.asarray(query), np.asarray(ref)
    M = len(q)
    Lq = M if q_len is None else int(q_len)
    L = len(r) if r_len is None else int(r_len)
    dist2 = np.full((M, k), np.inf, dtype=q.dtype)
    idx = np.full((M, k), -1, dtype=np.int64)
    if Lq == 0 or L == 0:
        return dist2, idx
    d = dist2_saturated(q[:Lq], r[:L])  # [Lq, L]; non-finite inputs are tested too
    order = np.argsort(d, axis=1, kind="stable")  # ties in index order; NaN last
    for m in range(Lq):
        chosen = order[m][d[m, order[m]] < np.inf][:k]
        dist2[m, : len(chosen)] = d[m, chosen]
        idx[m, : len(chosen)] = chosen
    return dist2, idx


def check_against_reference(query, ref, k, dist2, idx, q_lens=None, r_lens=None, work=None):
    """Exact comparison (indices and distance bits) of a batched result with knn_reference,
    computed in `work` precision (default: the inputs' own)."""
    work = work or query.dtype
    qn = query.detach().cpu().to(work).numpy()
    rn = ref.detach().cpu().to(work).numpy()
    for b in range(query.shape[0]):
        ql = None if q_lens is None else int(q_lens[b])
        rl = None if r_lens is None else int(r_lens[b])
        ref_d, ref_i = knn_reference(qn[b], rn[b], k, ql, rl)
        assert_equal(idx[b], torch.from_numpy(ref_i), what=f"idx[{b}] (lengths {ql}, {rl})")
        assert_equal(dist2[b], torch.from_numpy(ref_d).to(dist2.dtype), what=f"dist2[{b}]")


def check_row_properties(dist2, idx, k, L, Lq=None):
    """Rows sorted by (dist2, idx), indices unique and in [0, L), min(k, L) of them in valid
    rows (finite inputs), -1 / +inf after them and in invalid rows."""
    dist2, idx = dist2.detach().cpu().double(), idx.cpu()
    M = idx.shape[0]
    Lq = M if Lq is None else Lq
    n_valid = min(k, L)
    head_i, head_d = idx[:Lq, :n_valid], dist2[:Lq, :n_valid]
    assert ((head_i >= 0) & (head_i < L)).all(), "indices outside [0, L)"
    assert (idx[:Lq, n_valid:] == -1).all() and (dist2[:Lq, n_valid:] == np.inf).all()
    assert (idx[Lq:] == -1).all() and (dist2[Lq:] == np.inf).all(), "invalid queries must be -1 / +inf"
    if n_valid > 1:
        dd, di = head_d.diff(dim=1), head_i.diff(dim=1)
        assert ((dd > 0) | ((dd == 0) & (di > 0))).all(), "rows not sorted by (dist2, idx)"
    for m in range(Lq):
        assert len(set(head_i[m].tolist())) == n_valid, f"duplicate indices in row {m}"


# ---------------------------------------------------------------------------------------------
# results


@pytest.mark.parametrize(
    "M,N,k",
    [(1, 1, 1), (3, 2, 5), (5, 7, 3), (8, 8, 8), (7, 1, 1), (2, 6, 6), (33, 100, 16), (40, 129, 32),
     (200, 513, 10), (64, 1025, 64), (50, 300, 100), (20, 700, 300), (10, 30, 1000)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference(device, gen, M, N, k, dtype):
    B = 3
    query = rand_points(B, M, gen, dtype=dtype)
    ref = rand_points(B, N, gen, dtype=dtype)
    dist2, idx = knn_op(query.to(device), ref.to(device), k)
    assert dist2.shape == (B, M, k) and idx.shape == (B, M, k)
    assert dist2.dtype == dtype and idx.dtype == torch.int64
    check_against_reference(query, ref, k, dist2, idx)


@pytest.mark.parametrize("k", BUCKET_KS)
def test_every_selection_path(device, gen, k):
    """Ragged batch, duplicate points (exact ties) and k from every bucket and the heap."""
    B, M, N = 3, 70, 400
    query = clustered_points(B, M, gen, clusters=4)
    ref = torch.cat([clustered_points(B, N // 2, gen, clusters=4), rand_points(B, N - N // 2, gen)], 1)
    q_lens = torch.tensor([M, 33, 0])
    r_lens = torch.tensor([N, 17, N])
    dist2, idx = knn_op(query.to(device), ref.to(device), k, q_lens.to(device), r_lens.to(device))
    check_against_reference(query, ref, k, dist2, idx, q_lens, r_lens)


@pytest.mark.parametrize("case", ["uniform", "clustered", "utm"])
def test_ragged_batches(device, gen, case):
    B, M, N, k = 6, 90, 300, 12
    if case == "uniform":
        query, ref = rand_points(B, M, gen), rand_points(B, N, gen)
    elif case == "clustered":  # many exact ties and duplicate points
        query, ref = clustered_points(B, M, gen, clusters=4), clustered_points(B, N, gen, clusters=4)
    else:  # lidar in UTM metres: 1e5 offsets, a 100 m extent
        query = rand_points(B, M, gen, scale=100.0, offset=1e5)
        ref = rand_points(B, N, gen, scale=100.0, offset=1e5)
    q_lens = random_lengths(B, M, gen)
    r_lens = random_lengths(B, N, gen)
    q_lens[0], r_lens[0] = M, N
    q_lens[1], r_lens[1] = 0, N
    q_lens[2], r_lens[2] = M, 0
    r_lens[3] = min(int(r_lens[3]), 5)  # fewer refs than k
    dist2, idx = knn_op(query.to(device), ref.to(device), k, q_lens.to(device), r_lens.to(device))
    check_against_reference(query, ref, k, dist2, idx, q_lens, r_lens)
    for b in range(B):
        check_row_properties(dist2[b], idx[b], k, int(r_lens[b]), int(q_lens[b]))


def test_ties_go_to_the_lower_index(device):
    """A constant cloud ties everywhere: the neighbours are 0, 1, ..., k-1 in order, and refs
    that repeat a point are taken in index order."""
    ref = torch.full((2, 50, 3), 0.25)
    query = torch.rand(2, 7, 3)
    dist2, idx = knn_op(query.to(device), ref.to(device), 20)
    assert_equal(idx, torch.arange(20).expand(2, 7, 20))
    assert (dist2 == dist2[..., :1]).all()
    # two groups of duplicates at different distances, interleaved in index order
    ref = torch.zeros(1, 10, 3)
    ref[0, 1::2, 0] = 1.0  # odd indices at distance 1 from the origin, even ones at 0
    dist2, idx = knn_op(torch.zeros(1, 1, 3, device=device), ref.to(device), 8)
    assert_equal(idx[0, 0], torch.tensor([0, 2, 4, 6, 8, 1, 3, 5]))


def test_utm_coordinates_match_float64(device, gen):
    """Clouds at 1e5 (UTM metres) give the float64 neighbours: no sentinel or cancellation
    spoils the distances. Near-ties may flip in float32, so the float64 distance of each
    returned neighbour is compared with the float64 k-th smallest distances."""
    B, M, N, k = 2, 200, 2000, 16
    query = rand_points(B, M, gen, scale=100.0, offset=1e5)
    ref = rand_points(B, N, gen, scale=100.0, offset=1e5)
    dist2, idx = knn_op(query.to(device), ref.to(device), k)
    q64, r64 = query.double(), ref.double()
    true = torch.cdist(q64, r64, compute_mode="donot_use_mm_for_euclid_dist").square()  # [B, M, N] in float64
    best = true.sort(dim=-1).values[..., :k]
    got = true.gather(-1, idx.cpu())
    assert_close(got, best, rtol=1e-6, what="float64 distance of the returned neighbours")
    assert_close(dist2.cpu().double(), best, rtol=1e-6, what="dist2")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_dtype(device, gen, dtype):
    """float32/float64 compute in their own precision, half types in float32 (exact upcast);
    dist2 comes back in the input dtype."""
    query = rand_points(2, 60, gen, dtype=dtype)
    ref = rand_points(2, 500, gen, dtype=dtype)
    dist2, idx = knn_op(query.to(device), ref.to(device), 10)
    assert dist2.dtype == dtype and idx.dtype == torch.int64
    work = torch.float64 if dtype == torch.float64 else torch.float32
    check_against_reference(query, ref, 10, dist2, idx, work=work)


def test_non_contiguous_inputs(device, gen):
    big_q = rand_points(4, 200, gen).to(device)
    big_r = rand_points(4, 600, gen).to(device)
    query = big_q.transpose(0, 1).contiguous().transpose(0, 1)[::2, ::3]  # strided in every dim
    ref = big_r.transpose(0, 1).contiguous().transpose(0, 1)[1::2, ::2]
    assert not query.is_contiguous() and not ref.is_contiguous()
    q_lens = torch.tensor([60, 3], device=device)[torch.tensor([0, 1], device=device)]
    d1, i1 = knn_op(query, ref, 9, q_lens)
    d2, i2 = knn_op(query.contiguous(), ref.contiguous(), 9, q_lens.contiguous())
    assert_equal(i1, i2)
    assert_equal(d1, d2)
    # a strided lengths tensor
    lens = torch.tensor([[5, 0], [300, 0]], device=device)[:, 0]
    assert not lens.is_contiguous()
    _, i3 = knn_op(query, ref, 9, None, lens)
    _, i4 = knn_op(query, ref, 9, None, lens.contiguous())
    assert_equal(i3, i4)


def test_empty_inputs(device, gen):
    d, i = knn_op(torch.empty(0, 10, 3, device=device), torch.empty(0, 20, 3, device=device), 4)
    assert d.shape == (0, 10, 4) and i.shape == (0, 10, 4)
    d, i = knn_op(torch.empty(2, 0, 3, device=device), torch.rand(2, 20, 3, device=device), 4)
    assert d.shape == (2, 0, 4)
    for k in (1, 5, 100):  # no refs: every slot empty
        d, i = knn_op(torch.rand(2, 5, 3, device=device), torch.empty(2, 0, 3, device=device), k)
        assert (i == -1).all() and (d == float("inf")).all()
    zeros = torch.zeros(2, dtype=torch.long, device=device)
    q, r = rand_points(2, 5, gen).to(device), rand_points(2, 8, gen).to(device)
    for args in ((zeros, None), (None, zeros), (zeros, zeros)):
        d, i = knn_op(q, r, 3, *args)
        assert (i == -1).all() and (d == float("inf")).all()


def test_indices_past_16_bits(device, gen):
    """Neighbours past index 65535 (kept in packed keys by the CPU heaps)."""
    query = rand_points(1, 40, gen)
    ref = rand_points(1, 70001, gen)
    ref[0, 65536:] *= 0.01  # the nearest refs of queries near the origin lie past 2**16
    query[0, :20] *= 0.01
    dist2, idx = knn_op(query.to(device), ref.to(device), 5)
    check_against_reference(query, ref, 5, dist2, idx)
    assert (idx[0, :20] >= 65536).any()


def test_k_larger_than_the_cloud(device, gen):
    query, ref = rand_points(2, 9, gen), rand_points(2, 5, gen)
    dist2, idx = knn_op(query.to(device), ref.to(device), 12)
    check_against_reference(query, ref, 12, dist2, idx)
    for b in range(2):
        check_row_properties(dist2[b], idx[b], 12, 5)


def test_properties_on_a_larger_ragged_batch(device, gen):
    B, M, N, k = 4, 500, 3000, 24
    query, ref = rand_points(B, M, gen), rand_points(B, N, gen)
    q_lens, r_lens = random_lengths(B, M, gen), random_lengths(B, N, gen)
    dist2, idx = knn_op(query.to(device), ref.to(device), k, q_lens.to(device), r_lens.to(device))
    for b in range(B):
        check_row_properties(dist2[b], idx[b], k, int(r_lens[b]), int(q_lens[b]))
    # the float64 distances of the neighbours are the k smallest float64 distances
    for b in range(B):
        Lq, L = int(q_lens[b]), int(r_lens[b])
        if Lq == 0 or L == 0:
            continue
        true = torch.cdist(query[b, :Lq].double(), ref[b, :L].double(),
                           compute_mode="donot_use_mm_for_euclid_dist").square()
        n = min(k, L)
        best = true.sort(dim=-1).values[:, :n]
        got = true.gather(-1, idx[b, :Lq, :n].cpu())
        assert_close(got, best, rtol=1e-5, atol=1e-12, what=f"cloud {b}")


def test_non_finite_points_are_never_neighbours(device):
    ref = torch.tensor([[[0.0, 0, 0], [float("nan"), 0, 0], [1, 0, 0], [float("inf"), 0, 0],
                         [2, 0, 0], [3e38, 3e38, 0]]])
    query = torch.tensor([[[0.1, 0, 0], [float("nan"), 0, 0], [float("inf"), 1, 1]]])
    dist2, idx = knn_op(query.to(device), ref.to(device), 5)
    check_against_reference(query, ref, 5, dist2, idx)
    assert_equal(idx[0, 0], torch.tensor([0, 2, 4, 5, -1]))  # inf, nan skipped; overflow saturates
    assert dist2[0, 0, 3].item() == torch.finfo(torch.float32).max
    assert (idx[0, 1:] == -1).all(), "a NaN or inf query has no neighbours"


def test_wrapper(gen):
    query, ref = rand_points(2, 30, gen), rand_points(2, 50, gen)
    d1, i1 = pcops.knn(query, ref, 4)
    d2, i2 = knn_op(query, ref, 4)
    assert_equal(i1, i2)
    # one unbatched cloud
    d3, i3 = pcops.knn(query[1], ref[1], 4)
    assert d3.shape == (30, 4)
    assert_equal(i3, i1[1])
    assert_equal(d3, d1[1])
    lens = torch.tensor([30, 7])
    assert_equal(pcops.knn(query, ref, 4, lens, lens)[1], knn_op(query, ref, 4, lens, lens)[1])


def test_compile_fullgraph_cpu(gen):
    """The fake implementation traces with static shapes (torch.compile, aot_eager: no C++
    compiler needed)."""
    query, ref = rand_points(2, 40, gen), rand_points(2, 60, gen)
    lens = torch.tensor([40, 11])

    def f(q, r, lens):
        d, i = knn_op(q, r, 5, lens)
        return d.clamp(max=1e30).sum(-1), i

    d1, i1 = torch.compile(f, fullgraph=True, backend="aot_eager")(query, ref, lens)
    d2, i2 = f(query, ref, lens)
    assert_equal(i1, i2)
    assert_equal(d1, d2)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, gen, requires_grad):
    query = rand_points(2, 30, gen, dtype=torch.float64).to(device).requires_grad_(requires_grad)
    ref = rand_points(2, 40, gen, dtype=torch.float64).to(device).requires_grad_(requires_grad)
    lens = torch.tensor([30, 11], device=device)
    torch.library.opcheck(knn_op, (query, ref, 5))
    torch.library.opcheck(knn_op, (query, ref, 50, lens, torch.tensor([40, 3], device=device)))
    torch.library.opcheck(knn_op, (query.float(), ref.float(), 70))  # CUDA: the heap path


# ---------------------------------------------------------------------------------------------
# gradients


def dense_dist2(query, ref, idx):
    """dist2 rebuilt with PyTorch ops from the chosen indices (autograd reference)."""
    safe = idx.clamp(min=0)
    B, M, k = idx.shape
    nb = torch.gather(ref, 1, safe.reshape(B, M * k, 1).expand(-1, -1, 3)).reshape(B, M, k, 3)
    diff = query.unsqueeze(2) - nb
    return torch.where(idx >= 0, (diff * diff).sum(-1), torch.zeros((), dtype=query.dtype, device=query.device))


def test_gradcheck_float64(device, gen):
    query = rand_points(2, 6, gen, dtype=torch.float64).to(device).requires_grad_()
    ref = rand_points(2, 9, gen, dtype=torch.float64).to(device).requires_grad_()
    lens = torch.tensor([9, 3], device=device)  # k > 3: slots with -1 / +inf in cloud 1

    def f(q, r):
        d, _ = knn_op(q, r, 5, torch.tensor([6, 4], device=device), lens)
        return torch.where(torch.isfinite(d), d, torch.zeros_like(d))

    torch.autograd.gradcheck(f, (query, ref))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_autograd_and_is_deterministic(device, gen, dtype):
    query = rand_points(3, 40, gen, dtype=dtype).to(device).requires_grad_()
    ref = rand_points(3, 30, gen, dtype=dtype).to(device).requires_grad_()
    r_lens = torch.tensor([30, 5, 0], device=device)
    dist2, idx = knn_op(query, ref, 8, None, r_lens)
    # the incoming gradient in the op's dtype; the float64 reference takes those same values
    # (a half-precision grad_output rounds by up to 2**-9 relative, and a ref point's gradient
    # sums ~24 such terms: compared with the unrounded g, bfloat16 missed atol 0.02 on some
    # seeds, e.g. PCOPS_TEST_SEED=1797261810)
    g = torch.randn(dist2.shape, generator=gen, dtype=torch.float64).to(device).to(dtype)
    gq, gr = torch.autograd.grad(dist2, (query, ref), g)
    assert gq.dtype == dtype and gr.dtype == dtype
    assert torch.isfinite(gq).all() and torch.isfinite(gr).all(), "empty slots leaked inf/nan"
    q64 = query.detach().double().requires_grad_()
    r64 = ref.detach().double().requires_grad_()
    gq_ref, gr_ref = torch.autograd.grad(dense_dist2(q64, r64, idx), (q64, r64), g.double())
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-2, atol=2e-2)
    assert_close(gq, gq_ref, **tol, what="grad query")
    assert_close(gr, gr_ref, **tol, what="grad ref")
    gq2, gr2 = torch.autograd.grad(knn_op(query, ref, 8, None, r_lens)[0], (query, ref), g)
    assert_equal(gq2, gq, what="grad query, second run")
    assert_equal(gr2, gr, what="grad ref, second run")


def test_backward_only_what_is_needed(device, gen):
    query = rand_points(2, 20, gen).to(device).requires_grad_()
    ref = rand_points(2, 25, gen).to(device)
    dist2, _ = knn_op(query, ref, 4)
    (gq,) = torch.autograd.grad(dist2.sum(), (query,))
    assert gq.shape == query.shape
    _, idx = knn_op(query, ref, 4)
    assert not idx.requires_grad


# ---------------------------------------------------------------------------------------------
# bad inputs: each raises a Python exception naming the op and the argument


def _bad_cases(device):
    q = torch.rand(2, 10, 3, device=device)
    r = torch.rand(2, 12, 3, device=device)
    L = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    return [
        ((torch.rand(10, 3, device=device), r, 4), ValueError, r"'query' must be a tensor of shape \[B, M, D\] with D >= 1, got a 2-D"),
        ((torch.rand(2, 10, 2, device=device), r, 4), ValueError, r"'ref' must have 2 \(the point dimension D of 'query'\) in dimension 2"),
        ((q, torch.rand(2, 12, 4, device=device), 4), ValueError, r"'ref' must have 3 \(the point dimension D of 'query'\) in dimension 2, got a 3-D .* \[2, 12, 4\]"),
        ((q, torch.rand(12, 3, device=device), 4), ValueError, r"'ref' must be a tensor of shape \[B, N, D\] with D >= 1, got a 2-D"),
        ((torch.ones(2, 10, 3, dtype=torch.int32, device=device), r, 4), TypeError, r"'query' must be a floating point"),
        ((q, torch.ones(2, 12, 3, dtype=torch.bool, device=device), 4), TypeError, r"'ref' must be a floating point"),
        ((q, r.double(), 4), TypeError, r"'ref' must have the dtype of 'query' \(Float\), got a 3-D Double tensor"),
        ((q, torch.rand(3, 12, 3, device=device), 4), ValueError, r"'ref' must have 2 \(the batch size B of 'query'\) in dimension 0"),
        ((q, r, 0), ValueError, r"'k' must be >= 1, got 0"),
        ((q, r, -5), ValueError, r"'k' must be >= 1, got -5"),
        ((q, r, 4, L(3)), ValueError, r"'query_lengths' must have 2 \(the batch size B\)"),
        ((q, r, 4, L(3.0, 4.0)), TypeError, r"'query_lengths' must be an int64 tensor"),
        ((q, r, 4, L(3, 11)), ValueError, r"'query_lengths' must hold values in \[0, M\] = \[0, 10\], got values in \[3, 11\]"),
        ((q, r, 4, L(-1, 5)), ValueError, r"'query_lengths' must hold values in \[0, M\]"),
        ((q, r, 4, None, L(3, 13)), ValueError, r"'ref_lengths' must hold values in \[0, N\] = \[0, 12\], got values in \[3, 13\]"),
        ((q, r, 4, None, L(-2, 0)), ValueError, r"'ref_lengths' must hold values in \[0, N\]"),
        ((q, r, 4, None, L([1, 2], [3, 4])), ValueError, r"'ref_lengths' must be a tensor of shape \[B\], got a 2-D"),
        ((q, r, 4, None, L(True, False)), TypeError, r"'ref_lengths' must be an int64 tensor"),
        ((q, r, 4, None, L(1, 2, 3)), ValueError, r"'ref_lengths' must have 2 \(the batch size B\)"),
    ]


@pytest.mark.parametrize("case", range(19))
def test_bad_inputs_raise(device, case, debug_checks):
    args, exc, pattern = _bad_cases(device)[case]
    with pytest.raises(exc, match=r"pcops\.knn: .*" + pattern):
        knn_op(*args)


def test_bad_cases_are_all_tested():
    assert len(_bad_cases("cpu")) == 19


# ---------------------------------------------------------------------------------------------
# CUDA: the same bits as the CPU, on every path, and well-behaved on streams, graphs, compile


def _cpu_and_cuda(query, ref, k, q_lens=None, r_lens=None):
    out_cpu = knn_op(query, ref, k, q_lens, r_lens)
    cu = lambda t: None if t is None else t.cuda()  # noqa: E731
    out_cuda = knn_op(cu(query), cu(ref), k, cu(q_lens), cu(r_lens))
    return out_cpu, out_cuda


@pytest.mark.parametrize(
    "B,M,N",
    # (1, 20, 5000) and (1, 3, 70000): few queries, so the refs are split over several threads
    # and the partial lists merged; the others one thread per query.
    [(1, 1, 1), (2, 5, 7), (3, 129, 130), (2, 300, 1000), (1, 20, 5000), (1, 3, 70000), (4, 1000, 257)],
)
@pytest.mark.parametrize("k", [1, 3, 8, 16, 32, 50, 64, 65, 150])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu_bitwise(cuda, gen, B, M, N, k, dtype):
    query = clustered_points(B, M, gen, dtype=dtype, clusters=16)  # ties across split ranges
    ref = torch.cat([clustered_points(B, N // 2, gen, dtype=dtype, clusters=16),
                     rand_points(B, N - N // 2, gen, dtype=dtype)], 1)
    (d_cpu, i_cpu), (d_cuda, i_cuda) = _cpu_and_cuda(query, ref, k)
    assert_equal(i_cuda, i_cpu, what="idx")
    assert_equal(d_cuda, d_cpu, what="dist2")


@pytest.mark.sanitizer
@pytest.mark.parametrize("k", [1, 5, 16, 64, 65, 300])
def test_cuda_small_ragged_against_reference(cuda, gen, k):
    """Small enough for compute-sanitizer (memcheck, racecheck, initcheck)."""
    B, M, N = 3, 37, 150
    query, ref = clustered_points(B, M, gen, clusters=4), rand_points(B, N, gen)
    q_lens, r_lens = torch.tensor([37, 0, 20]), torch.tensor([150, 9, 0])
    dist2, idx = knn_op(query.cuda(), ref.cuda(), k, q_lens.cuda(), r_lens.cuda())
    check_against_reference(query, ref, k, dist2, idx, q_lens, r_lens)


@pytest.mark.sanitizer
def test_cuda_split_path_small(cuda, gen):
    """Few queries and enough refs to split: partial lists and the merge, under the sanitizer."""
    query, ref = clustered_points(1, 5, gen, clusters=4), clustered_points(1, 2000, gen, clusters=4)
    for k in (1, 7, 33):
        dist2, idx = knn_op(query.cuda(), ref.cuda(), k)
        check_against_reference(query, ref, k, dist2, idx)


@pytest.mark.sanitizer
def test_cuda_global_heap_small(cuda, gen):
    """k too large for the shared-memory heaps: the heaps live in the output rows."""
    query, ref = rand_points(2, 40, gen), rand_points(2, 2500, gen)
    r_lens = torch.tensor([2500, 1000])
    dist2, idx = knn_op(query.cuda(), ref.cuda(), 2000, None, r_lens.cuda())
    check_against_reference(query, ref, 2000, dist2, idx, None, r_lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_heap_path_for_small_k(cuda, gen, dtype):
    """The forced brute_heap path sends small k to the heap kernel too, brute to the register
    kernels: the same bits as the CPU."""
    query = clustered_points(3, 300, gen, dtype=dtype, clusters=8)
    ref = torch.cat([clustered_points(3, 400, gen, dtype=dtype, clusters=8), rand_points(3, 600, gen, dtype=dtype)], 1)
    r_lens = torch.tensor([1000, 3, 0])
    for k in (1, 16, 64):
        d_cpu, i_cpu = knn_op(query, ref, k, None, r_lens)
        d_reg, i_reg = force("knn", "brute", query.cuda(), ref.cuda(), k, None, r_lens.cuda())
        d_heap, i_heap = force("knn", "brute_heap", query.cuda(), ref.cuda(), k, None, r_lens.cuda())
        assert_equal(i_heap, i_cpu, what=f"idx, heap, k={k}")
        assert_equal(d_heap, d_cpu, what=f"dist2, heap, k={k}")
        assert_equal(i_reg, i_cpu, what=f"idx, registers, k={k}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_ragged_every_dtype(cuda, gen, dtype):
    B, M, N = 5, 300, 900
    query = rand_points(B, M, gen, dtype=dtype, scale=100.0, offset=1e5 if dtype == torch.float64 else 0.0)
    ref = rand_points(B, N, gen, dtype=dtype, scale=100.0, offset=1e5 if dtype == torch.float64 else 0.0)
    q_lens, r_lens = random_lengths(B, M, gen), random_lengths(B, N, gen)
    for k in (4, 40, 100):
        (d_cpu, i_cpu), (d_cuda, i_cuda) = _cpu_and_cuda(query, ref, k, q_lens, r_lens)
        assert d_cuda.dtype == dtype
        assert_equal(i_cuda, i_cpu, what=f"idx, k={k}")
        assert_equal(d_cuda, d_cpu, what=f"dist2, k={k}")


def test_cuda_utm_float32(cuda, gen):
    query = rand_points(2, 500, gen, scale=100.0, offset=1e5)
    ref = rand_points(2, 4000, gen, scale=100.0, offset=1e5)
    (d_cpu, i_cpu), (d_cuda, i_cuda) = _cpu_and_cuda(query, ref, 16)
    assert_equal(i_cuda, i_cpu)
    assert_equal(d_cuda, d_cpu)


def test_cuda_large(cuda, gen):
    """Large clouds, a multiple of no block size: against the CPU (itself checked above)."""
    query, ref = rand_points(2, 20011, gen), rand_points(2, 100003, gen)
    q_lens = torch.tensor([20011, 12345])
    for k in (1, 16, 64):
        (d_cpu, i_cpu), (d_cuda, i_cuda) = _cpu_and_cuda(query, ref, k, q_lens)
        assert_equal(i_cuda, i_cpu, what=f"idx, k={k}")
        assert_equal(d_cuda, d_cpu, what=f"dist2, k={k}")


def test_cuda_100k_queries_and_refs(cuda, gen):
    """M = N = 100 000 on the GPU; every query is independent, so a random subset of the rows is
    checked against the CPU op (the whole grid would take minutes there) and every row against
    the properties (sorted, unique, in range)."""
    B, M, N = 1, 100_000, 100_000
    query, ref = rand_points(B, M, gen), rand_points(B, N, gen)
    rows = torch.randperm(M, generator=gen)[:1500]
    for k in (16, 200):
        dist2, idx = knn_op(query.cuda(), ref.cuda(), k)
        d_cpu, i_cpu = knn_op(query[:, rows], ref, k)
        assert_equal(idx[:, rows.cuda()], i_cpu, what=f"idx, k={k}")
        assert_equal(dist2[:, rows.cuda()], d_cpu, what=f"dist2, k={k}")
        check_row_properties(dist2[0, ::97], idx[0, ::97], k, N)


def test_cuda_large_k(cuda, gen):
    query, ref = rand_points(2, 3000, gen), rand_points(2, 5000, gen)
    for k in (128, 200, 1000):
        (d_cpu, i_cpu), (d_cuda, i_cuda) = _cpu_and_cuda(query, ref, k)
        assert_equal(i_cuda, i_cpu, what=f"idx, k={k}")
        assert_equal(d_cuda, d_cpu, what=f"dist2, k={k}")


def test_cuda_deterministic(cuda, gen):
    query, ref = clustered_points(4, 3000, gen, device="cuda"), clustered_points(4, 3000, gen, device="cuda")
    for k in (16, 100):
        d1, i1 = knn_op(query, ref, k)
        d2, i2 = knn_op(query, ref, k)
        assert_equal(i1, i2)
        assert_equal(d1, d2)


def test_cuda_side_stream(cuda, gen):
    query, ref = rand_points(3, 2000, gen), rand_points(3, 3000, gen)
    expected = knn_op(query, ref, 16)
    qc, rc = query.cuda(), ref.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # keep the side stream busy: a default-stream launch would race
        qs = qc * 1.0  # produced on the side stream
        d, i = knn_op(qs, rc, 16)
    torch.cuda.current_stream().wait_stream(side)
    assert_equal(i, expected[1])
    assert_equal(d, expected[0])


def test_cuda_graph_capture(cuda, gen):
    query = rand_points(2, 1000, gen, device="cuda")
    ref = rand_points(2, 1500, gen, device="cuda")
    lens = torch.tensor([1500, 700], device="cuda")
    static_q, static_r = query.clone(), ref.clone()
    outs = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for k in (8, 100, 200):  # warm-up outside the capture
            knn_op(static_q, static_r, k, None, lens)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in (8, 100, 200):  # registers, shared heap, shared heap over 48 KiB
            outs[k] = knn_op(static_q, static_r, k, None, lens)
    new_q = rand_points(2, 1000, gen, device="cuda")
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    for k in (8, 100, 200):
        d, i = knn_op(new_q, static_r, k, None, lens)
        assert_equal(outs[k][1], i, what=f"idx after replay, k={k}")
        assert_equal(outs[k][0], d, what=f"dist2 after replay, k={k}")


def test_cuda_graph_capture_split_path(cuda, gen):
    """The split path uses a workspace and two kernels: also capturable."""
    query = rand_points(1, 8, gen, device="cuda")
    ref = rand_points(1, 20000, gen, device="cuda")
    knn_op(query, ref, 16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d, i = knn_op(query, ref, 16)
    graph.replay()
    torch.cuda.synchronize()
    d2, i2 = knn_op(query, ref, 16)
    assert_equal(i, i2)
    assert_equal(d, d2)


def test_cuda_compile_fullgraph(cuda, gen):
    query = rand_points(2, 500, gen, device="cuda")
    ref = rand_points(2, 800, gen, device="cuda")

    def f(q, r):
        d, i = knn_op(q, r, 16)
        return torch.sqrt(d).mean(-1), i

    compiled = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        a = compiled(query, ref)
    b = f(query, ref)
    assert_equal(a[1], b[1])
    assert_close(a[0], b[0], rtol=1e-6)


def test_cuda_bad_inputs_and_mixed_devices(cuda):
    q = torch.rand(2, 10, 3)
    r = torch.rand(2, 12, 3)
    with pytest.raises(ValueError, match=r"pcops\.knn: .*'ref' must be on the same device as 'query'"):
        knn_op(q.cuda(), r, 4)
    with pytest.raises(ValueError, match=r"pcops\.knn: .*'query' is .* while another argument is on CUDA"):
        knn_op(q, r.cuda(), 4)
    with pytest.raises(ValueError, match=r"pcops\.knn: .*'query_lengths' must be on the same device"):
        knn_op(q.cuda(), r.cuda(), 4, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"pcops\.knn: .*'query' is .* while another argument is on CUDA"):
        knn_op(q, r, 4, None, torch.tensor([3, 4], device="cuda"))


def test_cuda_second_device(cuda, gen):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    query, ref = rand_points(2, 300, gen), rand_points(2, 500, gen)
    d, i = knn_op(query.to("cuda:1"), ref.to("cuda:1"), 20)
    assert i.device == torch.device("cuda:1")
    d_cpu, i_cpu = knn_op(query, ref, 20)
    assert_equal(i, i_cpu)
    assert_equal(d, d_cpu)


# ---------------------------------------------------------------------------------------------
# the warp select (CUDA, float32, N <= 1024)


def _snapped(B, N, gen, step=0.125):
    """Points on a coarse lattice: many exactly equal distances, so the k-th key ties."""
    return (torch.rand(B, N, 3, generator=gen) * 4).div(step).floor().mul(step)


@pytest.mark.parametrize("N", [1, 31, 100, 256, 257, 700, 1024])
def test_cuda_warp_select_equals_brute(cuda, gen, N):
    """Every k against the brute force bit for bit, and against the float64-free
    NumPy reference on one k: uniform, clustered and snapped (tied) refs, ragged lengths."""
    B, M = 3, 70
    refs = {
        "uniform": rand_points(B, N, gen),
        "clustered": clustered_points(B, N, gen, clusters=4),
        "snapped": _snapped(B, N, gen),
    }
    query = torch.cat([rand_points(B, M - 10, gen) * 4, _snapped(B, 10, gen)], 1)
    q_lens = torch.tensor([M, M - 7, 0])
    r_lens = torch.tensor([N, max(N // 2, 1), N])
    for name, ref in refs.items():
        qc, rc = query.cuda(), ref.cuda()
        for k in sorted({1, 2, 7, 16, 32, 33, 64, 65, 128, 300, N, N + 5}):
            brute = force("knn", "brute", qc, rc, k, q_lens.cuda(), r_lens.cuda())
            d, i = force("knn", "warp_select", qc, rc, k, q_lens.cuda(), r_lens.cuda())
            assert_equal(i, brute[1], what=f"idx, {name}, N={N}, k={k}")
            assert_equal(d, brute[0], what=f"dist2, {name}, N={N}, k={k}")
        d, i = force("knn", "warp_select", qc, rc, 40, q_lens.cuda(), r_lens.cuda())
        check_against_reference(query, ref, 40, d.cpu(), i.cpu(), q_lens, r_lens)


def test_cuda_warp_select_identical_and_non_finite(cuda, gen):
    """All refs identical (every key ties), refs / queries with inf / nan: never neighbours,
    the rows padded with (+inf, -1) past the finite ones; refs whose distance overflows: at
    FLT_MAX, in index order."""
    B, M, N = 2, 40, 600
    ref = torch.full((B, N, 3), 0.25)
    ref[1] = rand_points(1, N, gen)[0]
    ref[1, ::7, 0] = float("inf")
    ref[1, 3::11, 1] = float("nan")
    ref[1, 5::13, 2] = 3e38  # finite: the squared distance saturates at FLT_MAX
    query = rand_points(B, M, gen)
    query[0, 3] = float("nan")
    query[1, 5, 2] = float("-inf")
    for k in (1, 16, 100, 600, 700):
        brute = force("knn", "brute", query.cuda(), ref.cuda(), k, None, None)
        d, i = force("knn", "warp_select", query.cuda(), ref.cuda(), k, None, None)
        assert_equal(i, brute[1], what=f"idx, k={k}")
        assert_equal(d, brute[0], what=f"dist2, k={k}")
        check_against_reference(query, ref, k, d.cpu(), i.cpu())


def test_cuda_warp_select_refuses_what_it_cannot_take(cuda, gen):
    """Outside its range (float64, N > 1024) the forced warp select raises; it never falls back
    to another path."""
    q64, r64 = rand_points(2, 50, gen, dtype=torch.float64), rand_points(2, 300, gen, dtype=torch.float64)
    with pytest.raises(ValueError, match="path 'warp_select' does not run on CUDA for float64"):
        force("knn", "warp_select", q64.cuda(), r64.cuda(), 8)
    with pytest.raises(ValueError, match="path 'warp_select' cannot take these inputs"):
        force("knn", "warp_select", rand_points(2, 50, gen).cuda(), rand_points(2, 1025, gen).cuda(), 8)


def test_warp_select_does_not_run_on_cpu(gen):
    query, ref = rand_points(2, 30, gen), rand_points(2, 200, gen)
    with pytest.raises(ValueError, match="path 'warp_select' does not run on the CPU"):
        force("knn", "warp_select", query, ref, 20)


@pytest.mark.sanitizer
def test_cuda_warp_select_sanitizer(cuda, gen):
    """Small enough for compute-sanitizer: ragged lengths, ties, k below and above N."""
    query, ref = rand_points(2, 9, gen), _snapped(2, 300, gen)
    r_lens = torch.tensor([300, 37])
    for k in (5, 128, 310):
        d, i = force("knn", "warp_select", query.cuda(), ref.cuda(), k, None, r_lens.cuda())
        check_against_reference(query, ref, k, d.cpu(), i.cpu(), None, r_lens)


def test_cuda_warp_select_graph_capture(cuda, gen):
    """One launch, no host synchronisation: capture, replay on new data."""
    query, ref = rand_points(4, 256, gen).cuda(), rand_points(4, 1000, gen).cuda()
    for _ in range(2):
        force("knn", "warp_select", query, ref, 100, None, None)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d, i = force("knn", "warp_select", query, ref, 100, None, None)
    query.copy_(rand_points(4, 256, gen).cuda())
    ref.copy_(rand_points(4, 1000, gen).cuda())
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(query.cpu(), ref.cpu(), 100, d.cpu(), i.cpu())
