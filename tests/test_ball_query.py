"""ball_query: against an independent NumPy reference, properties in float64, ragged batches,
ties and duplicates, UTM coordinates, every dtype, empty inputs, bad inputs, and CUDA (streams,
graphs, torch.compile)."""
import numpy as np
import pytest
import torch

import pcops
from helpers import FLOAT_DTYPES, assert_equal, clustered_points, dist2_saturated, rand_points, random_lengths
from pcops._paths import force

bq_op = torch.ops.pcops.ball_query.default


# ---------------------------------------------------------------------------------------------
# references


def ball_query_reference(query, ref, radius, nsample, query_lengths=None, ref_lengths=None):
    """Written for clarity with NumPy, in the arrays' own precision (float32 or float64): the
    contract's d = (dx*dx + dy*dy) + dz*dz against radius**2 (computed in float64, rounded once
    to the dtype), the first nsample hits in index order, the rest repeating the first, -1 for
    none. Returns (idx, count) as int64 arrays."""
    query, ref = np.asarray(query), np.asarray(ref)
    B, M, _ = query.shape
    N = ref.shape[1]
    r2 = query.dtype.type(float(radius) * float(radius))
    idx = np.full((B, M, nsample), -1, dtype=np.int64)
    count = np.zeros((B, M), dtype=np.int64)
    for b in range(B):
        Lq = M if query_lengths is None else int(query_lengths[b])
        Lr = N if ref_lengths is None else int(ref_lengths[b])
        d = dist2_saturated(query[b, :Lq], ref[b, :Lr])  # [Lq, Lr]; an overflow saturates
        for m in range(Lq):
            hits = np.nonzero(d[m] < r2)[0][:nsample]
            count[b, m] = len(hits)
            if len(hits):
                idx[b, m, :] = hits[0]
                idx[b, m, : len(hits)] = hits
    return idx, count


def check_properties_in_float64(query, ref, radius, idx, count, query_lengths=None, ref_lengths=None, rel=1e-5):
    """What the output must mean, checked in float64 with a margin for the compute dtype's
    rounding: neighbours inside the ball and in increasing order, the slots past count equal
    to the first, no ball member skipped before the last one returned, count == nsample or
    every valid ref scanned."""
    q = np.asarray(query, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    idx, count = np.asarray(idx), np.asarray(count)
    B, M, S = idx.shape
    N = r.shape[1]
    r2 = radius * radius
    for b in range(B):
        L = N if ref_lengths is None else int(ref_lengths[b])
        d = ((r[b, None, :L, :] - q[b, :, None, :]) ** 2).sum(-1)  # [M, L]
        for m in range(M):
            c = int(count[b, m])
            row = idx[b, m]
            if query_lengths is not None and m >= int(query_lengths[b]):
                assert c == 0 and (row == -1).all(), f"({b},{m}): an invalid query must give -1 and count 0"
                continue
            if c == 0:
                assert (row == -1).all(), f"({b},{m}): no neighbour must give -1, got {row}"
                assert not (d[m] < r2 * (1 - rel)).any(), f"({b},{m}): a clear neighbour was missed"
                continue
            head = row[:c]
            assert (np.diff(head) > 0).all(), f"({b},{m}): not increasing: {head}"
            assert ((head >= 0) & (head < L)).all(), f"({b},{m}): outside [0, {L}): {head}"
            assert (d[m, head] < r2 * (1 + rel)).all(), f"({b},{m}): a returned point is outside the ball"
            assert (row[c:] == head[0]).all(), f"({b},{m}): padding must repeat the first neighbour"
            skipped = np.setdiff1d(np.nonzero(d[m, : head[-1] + 1] < r2 * (1 - rel))[0], head)
            assert len(skipped) == 0, f"({b},{m}): ball members {skipped} skipped"
            if c < S:
                clear = np.nonzero(d[m] < r2 * (1 - rel))[0]
                assert np.isin(clear, head).all(), f"({b},{m}): count {c} < nsample but members were missed"


def run(query, ref, radius, nsample, query_lengths=None, ref_lengths=None, device="cpu"):
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    idx, count = bq_op(query.to(device), ref.to(device), radius, nsample, mv(query_lengths), mv(ref_lengths))
    assert idx.dtype == torch.int64 and count.dtype == torch.int64
    return idx.cpu(), count.cpu()


def assert_matches_reference(query, ref, radius, nsample, query_lengths=None, ref_lengths=None, device="cpu"):
    idx, count = run(query, ref, radius, nsample, query_lengths, ref_lengths, device)
    ql = None if query_lengths is None else query_lengths.cpu()
    rl = None if ref_lengths is None else ref_lengths.cpu()
    ref_idx, ref_count = ball_query_reference(query.numpy(), ref.numpy(), radius, nsample, ql, rl)
    assert_equal(idx, torch.from_numpy(ref_idx), what="idx")
    assert_equal(count, torch.from_numpy(ref_count), what="count")
    return idx, count


# ---------------------------------------------------------------------------------------------
# results


@pytest.mark.parametrize("B,M,N,S", [(1, 1, 1, 1), (2, 3, 2, 5), (3, 5, 7, 3), (2, 8, 8, 8), (2, 17, 31, 4),
                                     (2, 9, 32, 32), (3, 33, 33, 16), (2, 40, 255, 32), (2, 64, 256, 64),
                                     (2, 31, 257, 100), (1, 128, 1000, 32), (2, 50, 3000, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference(device, gen, B, M, N, S, dtype):
    ref = rand_points(B, N, gen, dtype=dtype)
    query = rand_points(B, M, gen, dtype=dtype)
    for radius in (0.05, 0.2, 0.5):  # few, some and many neighbours (early exit)
        idx, count = assert_matches_reference(query, ref, radius, S, device=device)
        check_properties_in_float64(query, ref, radius, idx, count)


@pytest.mark.parametrize("case", ["uniform", "clustered", "utm", "centred"])
def test_ragged_batches(device, gen, case):
    B, M, N, S = 6, 70, 300, 16
    if case == "uniform":
        ref, query, radius = rand_points(B, N, gen), rand_points(B, M, gen), 0.2
    elif case == "clustered":  # duplicate points and exact distance ties
        ref, query, radius = clustered_points(B, N, gen, clusters=4), clustered_points(B, M, gen, clusters=4), 0.3
    elif case == "utm":  # lidar in UTM metres: 1e5 offsets, a 100 m extent
        ref = rand_points(B, N, gen, scale=100.0, offset=1e5)
        query, radius = rand_points(B, M, gen, scale=100.0, offset=1e5), 15.0
    else:  # centred shapes: many points within 0.03 of the origin
        ref = rand_points(B, N, gen, scale=0.06, offset=-0.03)
        query, radius = rand_points(B, M, gen, scale=0.06, offset=-0.03), 0.01
    ql, rl = random_lengths(B, M, gen), random_lengths(B, N, gen)
    ql[0], rl[0] = M, 0
    ql[1], rl[1] = 0, N
    ql[2], rl[2] = M, 1
    idx, count = assert_matches_reference(query, ref, radius, S, ql, rl, device=device)
    for b in range(B):
        assert (idx[b, int(ql[b]):] == -1).all() and (count[b, int(ql[b]):] == 0).all(), "invalid queries"
        assert (idx[b] < max(int(rl[b]), 1)).all(), "index past ref_lengths"
    check_properties_in_float64(query, ref, radius, idx, count, ql, rl)


def test_points_at_the_origin_are_neighbours(device):
    """pointnet2_ops skips every point within about 0.03 of the origin; we must not."""
    ref = torch.tensor([[[0.0, 0.0, 0.0], [1e-3, 0, 0], [0, -0.02, 0.01], [0.5, 0.5, 0.5], [0, 0, 1e-30]]])
    query = torch.zeros(1, 2, 3)
    query[0, 1] = torch.tensor([0.5, 0.5, 0.5])
    idx, count = run(query, ref, 0.05, 6, device=device)
    assert idx[0, 0].tolist() == [0, 1, 2, 4, 0, 0] and count[0, 0] == 4
    assert idx[0, 1].tolist() == [3] * 6 and count[0, 1] == 1


def test_empty_ball_is_minus_one_not_zero(device, gen):
    ref = rand_points(2, 100, gen)
    query = rand_points(2, 10, gen, offset=10.0)  # far from every point
    idx, count = run(query, ref, 0.5, 8, device=device)
    assert (idx == -1).all() and (count == 0).all()


def test_radius_is_strict_and_exact(device):
    """Integer coordinates, so distances are exact: d == radius**2 is outside the ball."""
    ref = torch.tensor([[[1.0, 0, 0], [0, 2, 0], [0, 0, 0.5], [1, 1, 0], [0, 0, -1]]])
    query = torch.zeros(1, 1, 3)
    for dtype in (torch.float32, torch.float64):
        idx, count = run(query.to(dtype), ref.to(dtype), 1.0, 4, device=device)
        assert idx[0, 0].tolist() == [2, 2, 2, 2] and count[0, 0] == 1
        idx, count = run(query.to(dtype), ref.to(dtype), 1.0 + 1e-6, 4, device=device)
        assert idx[0, 0].tolist() == [0, 2, 4, 0] and count[0, 0] == 3


def test_nsample_caps_the_count_and_takes_the_first_in_index_order(device, gen):
    ref = rand_points(1, 500, gen, scale=0.1)  # every point inside the ball
    query = rand_points(1, 3, gen, scale=0.1)
    idx, count = run(query, ref, 1.0, 37, device=device)
    assert (count == 37).all()
    assert_equal(idx[0], torch.arange(37).expand(3, 37))
    idx, count = run(query, ref, 1.0, 700, device=device)  # nsample > N: 500 found, then repeats of 0
    assert (count == 500).all()
    assert_equal(idx[0, :, :500], torch.arange(500).expand(3, 500))
    assert (idx[0, :, 500:] == 0).all()


def test_duplicate_points_are_all_returned(device):
    ref = torch.full((1, 70, 3), 0.25)  # one point, 70 times
    query = torch.full((1, 2, 3), 0.25)
    query[0, 1, 0] = 0.75
    idx, count = run(query, ref, 0.1, 64, device=device)
    assert_equal(idx[0, 0], torch.arange(64))
    assert count[0, 0] == 64 and count[0, 1] == 0 and (idx[0, 1] == -1).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_dtype_computes_in_float32_or_float64(device, gen, dtype):
    ref = rand_points(2, 400, gen, dtype=dtype)
    query = rand_points(2, 60, gen, dtype=dtype)
    idx, count = run(query, ref, 0.15, 24, device=device)
    work = torch.float64 if dtype == torch.float64 else torch.float32  # half types: exact upcast
    ref_idx, ref_count = ball_query_reference(query.to(work).numpy(), ref.to(work).numpy(), 0.15, 24)
    assert_equal(idx, torch.from_numpy(ref_idx))
    assert_equal(count, torch.from_numpy(ref_count))


def test_radius_square_is_rounded_once(device):
    """radius**2 is computed in float64 and rounded once to the compute dtype: with
    radius = 0.1, float32 compares against float32(0.01), not against float32(0.1)**2, which is
    one ulp larger. Points on the circle of radius 0.1 fall on both sides of those two."""
    theta = torch.linspace(0, torch.pi / 2, 2001, dtype=torch.float64)
    ref = torch.stack([0.1 * theta.cos(), 0.1 * theta.sin(), 0 * theta], dim=-1)[None].float()
    query = torch.zeros(1, 1, 3)
    idx, count = run(query, ref, 0.1, 2001, device=device)
    ref_idx, ref_count = ball_query_reference(query.numpy(), ref.numpy(), 0.1, 2001)
    assert_equal(idx, torch.from_numpy(ref_idx))
    d = (ref[0, :, 0] * ref[0, :, 0] + ref[0, :, 1] * ref[0, :, 1]).numpy()
    wrong = int((d < np.float32(0.1) * np.float32(0.1)).sum())
    assert 0 < int(count) < wrong, "the two thresholds must disagree on this input"


def test_non_contiguous_inputs(device, gen):
    big_ref = rand_points(4, 600, gen).to(device)
    big_query = rand_points(4, 100, gen).to(device)
    ref = big_ref.transpose(0, 1).contiguous().transpose(0, 1)[::2, ::2]
    query = big_query[::2, 1::2]
    assert not ref.is_contiguous() and not query.is_contiguous()
    ql = torch.tensor([30, 7, 50, 9], device=device)[::2]
    rl = torch.tensor([300, 7, 0, 50], device=device)[::2]
    assert not ql.is_contiguous()
    a = bq_op(query, ref, 0.2, 16, ql, rl)
    b = bq_op(query.contiguous(), ref.contiguous(), 0.2, 16, ql.contiguous(), rl.contiguous())
    assert_equal(a[0], b[0])
    assert_equal(a[1], b[1])


@pytest.mark.parametrize("B,M,N", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (0, 0, 0)])
def test_empty_inputs(device, B, M, N):
    idx, count = bq_op(torch.rand(B, M, 3, device=device), torch.rand(B, N, 3, device=device), 0.5, 4)
    assert idx.shape == (B, M, 4) and count.shape == (B, M)
    assert (idx == -1).all() and (count == 0).all()


def test_wrapper_returns_idx_or_pair_and_feeds_group(device, gen):
    ref = rand_points(2, 200, gen).to(device)
    query = ref[:, :20]
    idx = pcops.ball_query(query, ref, 0.2, 16)
    idx2, count = pcops.ball_query(query, ref, 0.2, 16, return_count=True)
    assert_equal(idx, idx2)
    assert (count >= 1).all()  # every query is one of the points
    grouped = pcops.group(ref, idx)  # no mask needed: padding repeats a real neighbour
    assert ((grouped - query[:, :, None]).norm(dim=-1) < 0.2 + 1e-6).all()


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, gen, requires_grad):
    ref = rand_points(2, 40, gen).to(device).requires_grad_(requires_grad)
    query = rand_points(2, 9, gen).to(device).requires_grad_(requires_grad)
    torch.library.opcheck(bq_op, (query, ref, 0.3, 5))
    ql, rl = torch.tensor([9, 4], device=device), torch.tensor([40, 17], device=device)
    torch.library.opcheck(bq_op, (query, ref, 0.3, 50, ql, rl))


def test_integer_outputs_carry_no_gradient(gen):
    ref = rand_points(1, 30, gen).requires_grad_()
    idx, count = bq_op(ref[:, :5], ref, 0.3, 4)
    assert not idx.requires_grad and not count.requires_grad


# ---------------------------------------------------------------------------------------------
# bad inputs: each raises a Python exception naming the op and the argument


def _bad_cases(device):
    q = torch.rand(2, 5, 3, device=device)
    r = torch.rand(2, 10, 3, device=device)
    L = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    cases = [
        ((q[0], r, 0.1, 4), ValueError, r"'query' must be a tensor of shape \[B, M, D\] with D >= 1, got a 2-D"),
        ((q, r[..., :2], 0.1, 4), ValueError, r"'ref' must have 3 \(the point dimension D of 'query'\) in dimension 2, got a 3-D .* \[2, 10, 2\]"),
        ((q.int(), r, 0.1, 4), TypeError, r"'query' must be a floating point"),
        ((q, r.bool(), 0.1, 4), TypeError, r"'ref' must be a floating point"),
        ((q, r.double(), 0.1, 4), TypeError, r"'ref' must have the dtype of 'query' \(Float\), got a 3-D Double"),
        ((q, r[:1], 0.1, 4), ValueError, r"'ref' must have 2 \(the batch size B of 'query'\) in dimension 0"),
        ((q, r, 0.1, 0), ValueError, r"'nsample' must be >= 1, got 0"),
        ((q, r, 0.1, -2), ValueError, r"'nsample' must be >= 1, got -2"),
        ((q, r, 0.0, 4), ValueError, r"'radius' must be finite and > 0, got 0"),
        ((q, r, -1.0, 4), ValueError, r"'radius' must be finite and > 0, got -1"),
        ((q, r, float("inf"), 4), ValueError, r"'radius' must be finite and > 0, got inf"),
        ((q, r, float("nan"), 4), ValueError, r"'radius' must be finite and > 0, got nan"),
        ((q, r, 0.1, 4, L(5)), ValueError, r"'query_lengths' must have 2 \(the batch size B\)"),
        ((q, r, 0.1, 4, L(5.0, 5.0)), TypeError, r"'query_lengths' must be an int64 tensor"),
        ((q, r, 0.1, 4, L(5, 6)), ValueError, r"'query_lengths' must hold values in \[0, M\] = \[0, 5\], got values in \[5, 6\]"),
        ((q, r, 0.1, 4, L(-1, 2)), ValueError, r"'query_lengths' must hold values in \[0, M\] = \[0, 5\]"),
        ((q, r, 0.1, 4, None, L(3, 11)), ValueError, r"'ref_lengths' must hold values in \[0, N\] = \[0, 10\], got values in \[3, 11\]"),
        ((q, r, 0.1, 4, None, L([3, 4])), ValueError, r"'ref_lengths' must be a tensor of shape \[B\], got a 2-D"),
        ((q, r, 0.1, 4, None, L(3, 4).int()), TypeError, r"'ref_lengths' must be an int64 tensor"),
    ]
    if hasattr(torch, "float8_e4m3fn"):
        cases.append(((q.to(torch.float8_e4m3fn), r.to(torch.float8_e4m3fn), 0.1, 4), TypeError,
                      r"'query' must be a floating point tensor \(float32, float64, float16 or bfloat16\), got a 3-D Float8"))
    return cases


@pytest.mark.parametrize("case", range(20))
def test_bad_inputs_raise(device, case, debug_checks):
    cases = _bad_cases(device)
    if case >= len(cases):
        pytest.skip("no float8 in this torch")
    args, exc, pattern = cases[case]
    with pytest.raises(exc, match=r"pcops\.ball_query: .*" + pattern):
        bq_op(*args)


# ---------------------------------------------------------------------------------------------
# CUDA: against the CPU, streams, graphs, compile


def test_mixed_devices_raise(cuda):
    q, r = torch.rand(2, 5, 3), torch.rand(2, 10, 3)
    with pytest.raises(ValueError, match=r"pcops\.ball_query: .*'ref' must be on the same device as 'query'"):
        bq_op(q.cuda(), r, 0.1, 4)
    with pytest.raises(ValueError, match=r"pcops\.ball_query: .*'query' is .* while another argument is on CUDA"):
        bq_op(q, r.cuda(), 0.1, 4)
    with pytest.raises(ValueError, match=r"pcops\.ball_query: .*'ref_lengths' must be on the same device"):
        bq_op(q.cuda(), r.cuda(), 0.1, 4, None, torch.tensor([3, 4]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,M,N,S,radius", [(1, 1, 1, 1, 0.5), (3, 5, 7, 3, 0.5), (2, 17, 31, 4, 0.3),
                                            (2, 9, 255, 32, 0.2), (2, 33, 256, 64, 0.3), (3, 20, 257, 16, 0.1),
                                            (32, 512, 1024, 32, 0.2), (16, 128, 512, 64, 0.4),
                                            (2, 300, 20000, 32, 0.02), (1, 7, 200000, 48, 0.01)])
def test_cuda_matches_cpu(cuda, gen, dtype, B, M, N, S, radius):
    ref = rand_points(B, N, gen, dtype=dtype)
    query = rand_points(B, M, gen, dtype=dtype)
    ql, rl = random_lengths(B, M, gen), random_lengths(B, N, gen)
    for lengths in ((None, None), (ql, rl)):
        c_idx, c_count = run(query, ref, radius, S, *lengths, device="cpu")
        g_idx, g_count = run(query, ref, radius, S, *lengths, device="cuda")
        assert_equal(g_idx, c_idx, what="idx")
        assert_equal(g_count, c_count, what="count")


@pytest.mark.sanitizer
@pytest.mark.parametrize("B,M,N,S", [(1, 1, 1, 1), (2, 3, 2, 5), (3, 9, 33, 4), (2, 5, 300, 40), (2, 4, 0, 3)])
def test_cuda_small_against_reference(cuda, gen, B, M, N, S):
    ref, query = rand_points(B, N, gen), rand_points(B, M, gen)
    ql, rl = random_lengths(B, M, gen), random_lengths(B, N, gen)
    for radius in (0.1, 0.6):
        assert_matches_reference(query, ref, radius, S, device="cuda")
        assert_matches_reference(query, ref, radius, S, ql, rl, device="cuda")


@pytest.mark.sanitizer
def test_cuda_clustered_utm_and_origin(cuda, gen):
    B, M, N, S = 3, 40, 700, 24
    cases = [(clustered_points(B, N, gen, clusters=4), clustered_points(B, M, gen, clusters=4), 0.3),
             (rand_points(B, N, gen, scale=100.0, offset=1e5), rand_points(B, M, gen, scale=100.0, offset=1e5), 15.0),
             (rand_points(B, N, gen, scale=0.06, offset=-0.03), rand_points(B, M, gen, scale=0.06, offset=-0.03), 0.01)]
    for ref, query, radius in cases:
        assert_matches_reference(query, ref, radius, S, device="cuda")


def test_cuda_deterministic(cuda, gen):
    ref, query = rand_points(8, 4096, gen).cuda(), rand_points(8, 1024, gen).cuda()
    first = bq_op(query, ref, 0.1, 64)
    for _ in range(3):
        again = bq_op(query, ref, 0.1, 64)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


@pytest.mark.sanitizer
def test_cuda_side_stream(cuda, gen):
    ref, query = rand_points(4, 500, gen), rand_points(4, 64, gen)
    r, q = ref.cuda(), query.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            idx, count = bq_op(q * 1.0, r * 1.0, 0.2, 16)
    torch.cuda.current_stream().wait_stream(stream)
    ref_idx, ref_count = ball_query_reference(query.numpy(), ref.numpy(), 0.2, 16)
    assert_equal(idx, torch.from_numpy(ref_idx))
    assert_equal(count, torch.from_numpy(ref_count))


def test_cuda_graph_capture(cuda, gen):
    B, M, N, S = 4, 64, 500, 16
    ref, query = rand_points(B, N, gen).cuda(), rand_points(B, M, gen).cuda()
    ql, rl = torch.full((B,), M, device="cuda"), torch.full((B,), N, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bq_op(query, ref, 0.2, S, ql, rl)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, count = bq_op(query, ref, 0.2, S, ql, rl)
    for _ in range(2):
        new_ref, new_query = rand_points(B, N, gen), rand_points(B, M, gen)
        new_ql, new_rl = random_lengths(B, M, gen), random_lengths(B, N, gen)
        ref.copy_(new_ref), query.copy_(new_query), ql.copy_(new_ql), rl.copy_(new_rl)
        graph.replay()
        torch.cuda.synchronize()
        ref_idx, ref_count = ball_query_reference(new_query.numpy(), new_ref.numpy(), 0.2, S, new_ql, new_rl)
        assert_equal(idx, torch.from_numpy(ref_idx))
        assert_equal(count, torch.from_numpy(ref_count))


def test_cuda_torch_compile_fullgraph(cuda, gen):
    ref, query = rand_points(2, 300, gen).cuda(), rand_points(2, 32, gen).cuda()

    def grouped_offsets(q, r):
        idx = pcops.ball_query(q, r, 0.25, 16)
        return pcops.group(r, idx) - q[:, :, None]

    expected = grouped_offsets(query, ref)
    assert_equal(torch.compile(grouped_offsets, fullgraph=True)(query, ref), expected)
    graphed = torch.compile(grouped_offsets, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out = graphed(query, ref)
    assert_equal(out, expected)


# ---------------------------------------------------------------------------------------------
# the split brute force (path brute_split, CUDA, nsample <= 64): a thread per query, the refs
# split among the block's warps, the ranges' lists concatenated; split_sorted the same on the
# queries in a spatial order (each block skips the refs outside its queries' box widened by the
# radius); both against the warp-per-query brute force bit for bit, and against NumPy


def _split_vs_brute(query, ref, radius, S, ql=None, rl=None):
    brute = force("ball_query", "brute", query, ref, radius, S, ql, rl)
    split = force("ball_query", "brute_split", query, ref, radius, S, ql, rl)
    assert_equal(split[0], brute[0], what="split idx vs brute force")
    assert_equal(split[1], brute[1], what="split count vs brute force")
    ordered = force("ball_query", "split_sorted", query, ref, radius, S, ql, rl)
    assert_equal(ordered[0], brute[0], what="split (sorted queries) idx vs brute force")
    assert_equal(ordered[1], brute[1], what="split (sorted queries) count vs brute force")
    return split


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,M,N,S", [(1, 1, 1, 1), (2, 31, 33, 5), (3, 33, 127, 64), (2, 40, 129, 63),
                                     (2, 40, 300, 8), (2, 70, 1000, 32), (1, 65, 4100, 16),
                                     (2, 5, 5000, 40), (1, 40, 9000, 32)])
def test_cuda_split_matches_brute_and_reference(cuda, gen, dtype, B, M, N, S):
    """M and N off multiples of 32, blocks of 1, 2, 3, 4 and 8 warps (ranges of the refs), lists of 1-64, ragged
    lengths, radii from nearly empty balls to balls holding every ref (each range fills its
    list and stops early)."""
    ref, query = rand_points(B, N, gen, dtype=dtype), rand_points(B, M, gen, dtype=dtype)
    ql = random_lengths(B, M, gen, device="cuda")
    rl = random_lengths(B, N, gen, device="cuda")
    for radius in (0.05, 0.3, 2.0):
        idx, count = _split_vs_brute(query.cuda(), ref.cuda(), radius, S)
        e_idx, e_count = ball_query_reference(query.numpy(), ref.numpy(), radius, S)
        assert_equal(idx, torch.from_numpy(e_idx))
        assert_equal(count, torch.from_numpy(e_count))
        _split_vs_brute(query.cuda(), ref.cuda(), radius, S, ql, rl)
        _split_vs_brute(query.cuda(), ref.cuda(), radius, S, None, rl)


def test_cuda_split_clusters_duplicates_and_non_finite(cuda, gen):
    """Dense clusters (hits bunched in one warp's range), identical points (every ref a hit),
    NaN / inf refs and queries (never neighbours / none), UTM coordinates."""
    B, M, N = 2, 100, 2000
    cl = clustered_points(B, N, gen, clusters=3)
    same = torch.full((B, N, 3), 0.25, dtype=torch.float32)
    utm = rand_points(B, N, gen, scale=100.0, offset=1e5)
    bad = rand_points(B, N, gen)
    bad[0, ::7, 1] = float("nan")
    bad[1, ::5, 0] = float("inf")
    bad[1, 1::9, 2] = -float("nan")  # sign bit set
    assert (bad[1, 1].view(torch.int32)[2] < 0).item()
    for ref, radius in ((cl, 0.05), (same, 0.1), (utm, 9.0), (bad, 0.2)):
        query = ref[:, :M].clone()
        query[0, 3] = float("nan")
        query[1, 4, 2] = float("-inf")
        for S in (1, 16, 64):
            idx, count = _split_vs_brute(query.cuda(), ref.cuda(), radius, S)
            assert (count[0, 3] == 0).item() and (count[1, 4] == 0).item()
            assert (idx[0, 3] == -1).all()


def test_cuda_split_poisoned_outputs_and_auto(cuda, gen):
    """Every slot and count is written (outputs pre-filled with garbage by the caching
    allocator's previous block); AUTO takes the split path for S <= 64 at these sizes and the
    warp-per-query kernel above (both equal to the reference)."""
    B, M, N = 4, 96, 1024
    ref, query = rand_points(B, N, gen), rand_points(B, M, gen)
    for S in (32, 64, 65, 100):
        torch.full((B * M * S * 4,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")  # poison, freed
        idx, count = pcops.ball_query(query.cuda(), ref.cuda(), 0.3, S, return_count=True)
        e_idx, e_count = ball_query_reference(query.numpy(), ref.numpy(), 0.3, S)
        assert_equal(idx, torch.from_numpy(e_idx))
        assert_equal(count, torch.from_numpy(e_count))
    # S > 64: the split paths cannot take it, and say so
    for path in ("brute_split", "split_sorted"):
        with pytest.raises(ValueError, match=f"path '{path}' cannot take these inputs"):
            force("ball_query", path, query.cuda(), ref.cuda(), 0.3, 65)


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_split_sorted_box_edges(cuda, gen, dtype):
    """The box filter of split_sorted against the brute force where it could cut too much: refs on
    the axes through each query at the radius give or take a few ulps (in range or not by the
    last bit), queries in tight clusters (small boxes), UTM-sized coordinates, tiny and huge
    radii, more queries than the order kernel's threads (several a thread, 4 bits an axis)."""
    B, M = 2, 3000
    for offset, radius in ((0.0, 0.05), (3e5, 0.7), (0.0, 1e-6), (0.0, 1e30)):
        centres = offset + 0.1 * torch.rand(B, 6, 3, generator=gen, dtype=torch.float64)
        which = torch.randint(0, 6, (B, M), generator=gen)
        query = torch.gather(centres, 1, which[..., None].expand(B, M, 3))
        query = (query + 0.01 * torch.randn(B, M, 3, generator=gen, dtype=torch.float64)).to(dtype)
        # refs: for 200 queries, points at radius * (1 + t) along +-x, +-y, +-z
        ts = torch.tensor([-4, -2, -1, 0, 1, 2, 4], dtype=torch.float64) * torch.finfo(dtype).eps
        axes = torch.cat([torch.eye(3), -torch.eye(3)]).to(torch.float64)
        base = query[:, :200].to(torch.float64)
        steps = (radius * (1 + ts))[:, None, None] * axes[None]  # [7, 6, 3]
        ref = (base[:, :, None, None, :] + steps[None, None]).reshape(B, -1, 3)
        ref = ref[:, torch.randperm(ref.shape[1], generator=gen)].to(dtype)
        idx, count = _split_vs_brute(query.cuda(), ref.cuda(), radius, 64)
        if radius < 1e29:
            assert count.sum().item() > 0
    for B, M, N, S in ((1, 5000, 3000, 8), (3, 1025, 2100, 64)):
        ref, query = clustered_points(B, N, gen, dtype=dtype), clustered_points(B, M, gen, dtype=dtype)
        ql = random_lengths(B, M, gen, device="cuda")
        _split_vs_brute(query.cuda(), ref.cuda(), 0.13, S)
        _split_vs_brute(query.cuda(), ref.cuda(), 0.13, S, ql, None)


@pytest.mark.parametrize("path", ["brute_split", "split_sorted"])
def test_cuda_split_graph_capture(cuda, gen, path):
    B, M, N, S = 3, 50, 700, 32
    ref, query = rand_points(B, N, gen).cuda(), rand_points(B, M, gen).cuda()
    rl = torch.full((B,), N, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        force("ball_query", path, query, ref, 0.2, S, None, rl)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, count = force("ball_query", path, query, ref, 0.2, S, None, rl)
    new_ref, new_query, new_rl = rand_points(B, N, gen), rand_points(B, M, gen), random_lengths(B, N, gen)
    ref.copy_(new_ref), query.copy_(new_query), rl.copy_(new_rl)
    graph.replay()
    torch.cuda.synchronize()
    e_idx, e_count = ball_query_reference(new_query.numpy(), new_ref.numpy(), 0.2, S, None, new_rl)
    assert_equal(idx, torch.from_numpy(e_idx))
    assert_equal(count, torch.from_numpy(e_count))
