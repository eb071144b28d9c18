"""The error bound of the tensor-core shortlist (kernels/knn_nd/tc.cuh), checked on the CPU: the
kernel's arithmetic emulated in torch (operands rounded to TF32, products summed in chunks of 8
with truncating float32 accumulation, every other step in float32 as the kernel rounds it), and
for every pair |d~ - d| within e, where d is the exact path's float32 distance (summed over
d = 0 .. D-1 in order, no FMA). Also at the edge of the bound's accumulation budget (the
accumulated product off by the whole (D + 8) v S~ the bound allows), and the shortlist rule
itself: the k nearest by (d, index) all have d~ - e <= tau, with tau taken as the kernel takes
it (the largest of the four lanes' KL-th smallest d~ + e). No GPU needed."""
import math

import pytest
import torch

U, T, V = 2.0**-24, 2.0**-11, 2.0**-20
NORM_LIMIT = 2.0**100
F32 = torch.float32


def tc_bound(D):
    """(a, b) of kernels/knn_nd/tc.cuh tc_bound, as float32 values."""
    safe = 1.0 + 2.0**-10
    a = 2.0 * ((2 * T + T * T) + (D + 8) * V * (1 + T) ** 2) * (1 + 2 * D * U) * safe
    b = (6 * D + 32) * U * safe
    return torch.tensor(a, dtype=F32), torch.tensor(b, dtype=F32)


def lane_k(k):
    kl = 1
    while 4 * kl < k:
        kl *= 2
    return kl


def tf32(x):
    """x (float32) rounded to 10 mantissa bits, to nearest, ties away from zero (cvt.rna)."""
    bits = x.contiguous().view(torch.int32)
    mag = (bits & 0x7FFFFFFF) + 0x1000
    out = (mag & ~0x1FFF) | (bits & ~0x7FFFFFFF)
    return out.view(F32)


def ordered_sum_sq(x):
    """[P, D] float32 -> [P]: sum of x_d * x_d over d in order from +0, each op rounded."""
    acc = torch.zeros(x.shape[0], dtype=F32)
    for d in range(x.shape[1]):
        acc = acc + x[:, d] * x[:, d]
    return acc


def exact_distances(q, r):
    """[M, N] float32: the brute force's distances (knn_nd.h, L2)."""
    diff = q[:, None, :] - r[None, :, :]
    acc = torch.zeros(diff.shape[:2], dtype=F32)
    for d in range(q.shape[1]):
        acc = acc + diff[..., d] * diff[..., d]
    return acc


def toward_zero(x64):
    """float64 -> float32 rounded toward zero."""
    x32 = x64.to(F32)
    over = x32.double().abs() > x64.abs()
    return torch.where(over, torch.nextafter(x32, torch.zeros_like(x32)), x32)


def mma_dot(q, r):
    """[M, N] float32: q~ . r~ accumulated as the model of the bound says the tensor cores do
    it: exact products, 8 at a time added to a float32 accumulator with truncation."""
    qt, rt = tf32(q).double(), tf32(r).double()
    acc = torch.zeros(q.shape[0], r.shape[0], dtype=F32)
    for d0 in range(0, q.shape[1], 8):
        chunk = qt[:, d0:d0 + 8] @ rt[:, d0:d0 + 8].T  # exact: 11-bit significands, 8 terms
        acc = toward_zero(acc.double() + chunk)
    return acc


def norms(x, b):
    n = ordered_sum_sq(x)
    s = torch.sqrt(n)
    w = b * n + torch.tensor(2.0**-100, dtype=F32) * (torch.tensor(0.5, dtype=F32) + n)
    return n, s, w


def approx_and_bound(q, r, g):
    """(d~, e) [M, N] in float32, as the shortlist kernel computes them from g."""
    D = q.shape[1]
    a, b = tc_bound(D)
    nq, sq, wq = norms(q, b)
    nr, sr, wr = norms(r, b)
    approx = (nq[:, None] + nr[None, :]) - 2 * g
    e = (a * sq)[:, None] * sr[None, :] + (wq[:, None] + wr[None, :])
    ok = (nq <= NORM_LIMIT)[:, None] & (nr <= NORM_LIMIT)[None, :]
    return approx, e, ok


def check_bound(q, r, label):
    d = exact_distances(q, r)
    g = mma_dot(q, r)
    approx, e, ok = approx_and_bound(q, r, g)
    assert ok.any(), f"{label}: no pair below the norm limit"
    hi, lo = approx + e, approx - e
    bad = ok & ~((lo <= d) & (d <= hi))
    assert not bad.any(), (f"{label}: {int(bad.sum())} pairs outside the bound, e.g. d = "
                           f"{d[bad][0].item()!r}, d~ = {approx[bad][0].item()!r}, "
                           f"e = {e[bad][0].item()!r}")
    # the edge of the accumulation budget: g off by all of (D + 8) v S~, either way
    D = q.shape[1]
    qt, rt = tf32(q).double(), tf32(r).double()
    exact_g = qt @ rt.T
    budget = (D + 8) * V * (qt.abs() @ rt.abs().T)
    for sign in (1, -1):
        g_edge = toward_zero(exact_g + sign * budget)
        approx, e, _ = approx_and_bound(q, r, g_edge)
        hi, lo = approx + e, approx - e
        bad = ok & ~((lo <= d) & (d <= hi))
        assert not bad.any(), f"{label}: accumulation at the edge ({sign:+d}) breaks the bound"


def make_inputs(kind, D, gen):
    M, N = 48, 160
    x = torch.randn(M + N, D, generator=gen, dtype=torch.float64)
    if kind == "gaussian":
        pass
    elif kind == "offset":  # far from the origin: the band grows with |q| |r|
        x = x + 1e3
    elif kind == "huge":  # norms near the limit (about 2^96 < 2^100); 1e18 is refused
        x = x * (2.0**48 / D**0.5)
    elif kind == "tiny":  # subnormal squares and products
        x = x * 1e-21
    elif kind == "sphere":  # many near-ties: every point at distance ~1 from the origin
        x = x / x.norm(dim=1, keepdim=True)
    elif kind == "duplicates":
        x = torch.cat([x[: (M + N) // 4]] * 4)
    elif kind == "integers":
        x = torch.randint(-3, 4, (M + N, D), generator=gen).double()
    elif kind == "mixed":  # one large coordinate, the others small
        x = x * 1e-3
        x[:, 0] = x[:, 0] * 1e6
    elif kind == "relu":  # non-negative features with a large common component
        x = torch.relu(x) + 5.0
    elif kind == "halfway":  # every coordinate just below a TF32 tie, all positive: the
        # operand roundings (-2^-11 relative each) add up coherently, the bound's worst case
        x = tf32(x.abs().to(F32)).double() * (1 + 0.999 * 2.0**-11)
    x = x.to(F32)
    return x[:M], x[M:]


KINDS = ["gaussian", "offset", "huge", "tiny", "sphere", "duplicates", "integers", "mixed",
         "relu", "halfway"]


@pytest.mark.parametrize("D", [16, 64, 130, 1024])
@pytest.mark.parametrize("kind", KINDS)
def test_bound_holds_for_every_pair(gen, D, kind):
    q, r = make_inputs(kind, D, gen)
    check_bound(q, r, f"{kind}, D = {D}")


def test_huge_norms_are_refused(gen):
    q, r = make_inputs("gaussian", 64, gen)
    a, b = tc_bound(64)
    n, _, _ = norms((q * 1e18).to(F32), b)
    assert (n > NORM_LIMIT).all()  # 1e36 * 64 per point: the brute force's


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "duplicates", "relu", "halfway"])
@pytest.mark.parametrize("k", [1, 5, 20, 64])
def test_shortlist_holds_the_k_nearest(gen, kind, k):
    """tau as the kernel forms it (tc_quad_kth): lane j of a quad sees the columns c with
    (c % 8) // 2 == j and keeps its KL smallest d~ + e; tau is the k-th smallest of the four
    lanes' kept values together (+inf fills a lane with fewer than KL)."""
    D = 64
    q, r = make_inputs(kind, D, gen)
    d = exact_distances(q, r)
    approx, e, _ = approx_and_bound(q, r, mma_dot(q, r))
    hi, lo = approx + e, approx - e
    M, N = q.shape[0], r.shape[0]
    kl = lane_k(k)
    lane = (torch.arange(N) % 8) // 2
    kept = []
    for j in range(4):
        h = hi[:, lane == j].sort(dim=1).values[:, :kl]
        pad = torch.full((M, kl - h.shape[1]), math.inf)
        kept.append(torch.cat([h, pad], 1))
    tau = torch.cat(kept, 1).sort(dim=1).values[:, k - 1]
    keep = lo <= tau[:, None]
    # the k nearest by (d, index): a stable sort of d
    nearest = d.sort(dim=1, stable=True).indices[:, :k]
    assert torch.gather(keep, 1, nearest).all(), f"{kind}, k = {k}: a true neighbour was dropped"
    assert (keep.sum(1) >= min(k, N)).all()
    assert (hi <= tau[:, None]).sum(1).min() >= k  # tau bounds at least k refs' d~ + e
