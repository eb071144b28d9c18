"""pcops.ball_query_dist2: ball_query's neighbours in PyTorch3D's layout (-1 / 0 in empty slots)
with their squared distances, against an independent float64 loop, bit for bit against
ball_query + neighbor_dist2, with autograd, opcheck and input checks."""
import pytest
import torch

import pcops
from helpers import assert_close, assert_equal, rand_points, random_lengths

op = torch.ops.pcops.ball_query_dist2.default


def reference(query, ref, radius, S, query_lengths=None, ref_lengths=None):
    """float64 loop: the first S valid refs in index order with |q - r|^2 < radius^2 (compared
    in the input's compute dtype, as the op does), -1 / 0 after them."""
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, r = query.detach().cpu().to(compute), ref.detach().cpu().to(compute)
    B, M, N = q.shape[0], q.shape[1], r.shape[1]
    r2 = torch.tensor(radius * radius, dtype=torch.float64).to(compute)
    idx = torch.full((B, M, S), -1, dtype=torch.long)
    d2 = torch.zeros(B, M, S, dtype=torch.float64)
    for b in range(B):
        ql = M if query_lengths is None else int(query_lengths[b])
        rl = N if ref_lengths is None else int(ref_lengths[b])
        for m in range(ql):
            found = 0
            for n in range(rl):
                d = q[b, m] - r[b, n]
                dist = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]  # left to right, rounded each time
                if dist < r2 and found < S:
                    idx[b, m, found] = n
                    d2[b, m, found] = float(dist)
                    found += 1
    return idx, d2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("B,M,N,S", [(2, 20, 40, 8), (1, 1, 1, 1), (3, 5, 30, 40), (2, 4, 0, 3)])
def test_matches_reference(device, gen, dtype, B, M, N, S):
    query = rand_points(B, M, gen, dtype=dtype, device=device)
    ref = rand_points(B, N, gen, dtype=dtype, device=device)
    d2, idx = pcops.ball_query_dist2(query, ref, 0.35, S)
    ref_idx, ref_d2 = reference(query, ref, 0.35, S)
    assert idx.dtype == torch.long and d2.dtype == dtype and d2.device.type == device
    assert_equal(idx.cpu(), ref_idx, what="idx")
    assert_close(d2.cpu().double(), ref_d2, atol={torch.float16: 2e-3}.get(dtype, 0.0),
                 rtol={torch.float16: 2e-3}.get(dtype, 0.0), what="dist2")


def test_ragged_batches(device, gen):
    B, M, N, S = 3, 30, 50, 6
    query = rand_points(B, M, gen, device=device)
    ref = rand_points(B, N, gen, device=device)
    ql, rl = random_lengths(B, M, gen, device=device), random_lengths(B, N, gen, device=device)
    d2, idx = pcops.ball_query_dist2(query, ref, 0.4, S, ql, rl)
    ref_idx, ref_d2 = reference(query, ref, 0.4, S, ql.cpu(), rl.cpu())
    assert_equal(idx.cpu(), ref_idx, what="idx")
    assert_equal(d2.cpu().double(), ref_d2, what="dist2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bits_of_ball_query_and_neighbor_dist2(device, gen, dtype):
    """The same neighbours as ball_query (same search path), ball_query's first-neighbour
    padding replaced by -1, and neighbor_dist2's bits; also on a cloud large enough for the
    grid path."""
    for B, M, N, S in [(2, 64, 300, 16), (1, 2000, 20000, 32)]:
        query = rand_points(B, M, gen, dtype=dtype, device=device)
        ref = rand_points(B, N, gen, dtype=dtype, device=device)
        d2, idx = pcops.ball_query_dist2(query, ref, 0.05, S)
        bq, count = pcops.ball_query(query, ref, 0.05, S, return_count=True)
        expected = bq.masked_fill(torch.arange(S, device=device) >= count.unsqueeze(-1), -1)
        assert_equal(idx, expected, what="idx")
        assert_equal(d2, pcops.neighbor_dist2(query, ref, idx), what="dist2")


def test_cpu_and_cuda_give_the_same_bits(cuda, gen):
    query, ref = rand_points(2, 500, gen), rand_points(2, 3000, gen)
    cpu = pcops.ball_query_dist2(query, ref, 0.1, 24)
    gpu = pcops.ball_query_dist2(query.cuda(), ref.cuda(), 0.1, 24)
    assert_equal(gpu[1].cpu(), cpu[1], what="idx")
    assert_equal(gpu[0].cpu(), cpu[0], what="dist2")


def test_gradients_are_neighbor_dist2s(device, gen):
    query = rand_points(2, 20, gen, dtype=torch.float64, device=device).requires_grad_()
    ref = rand_points(2, 40, gen, dtype=torch.float64, device=device).requires_grad_()
    torch.autograd.gradcheck(lambda q, r: op(q, r, 0.4, 8)[0], (query, ref))
    d2, idx = op(query, ref, 0.4, 8)
    assert not idx.requires_grad
    w = torch.rand(d2.shape, generator=gen, dtype=torch.float64).to(device)
    got = torch.autograd.grad((d2 * w).sum(), (query, ref))
    want = torch.autograd.grad((pcops.neighbor_dist2(query, ref, idx) * w).sum(), (query, ref))
    assert_equal(got[0], want[0], what="grad query")
    assert_equal(got[1], want[1], what="grad ref")


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_opcheck(device, gen, requires_grad, dtype):
    query = rand_points(2, 6, gen, dtype=dtype, device=device).requires_grad_(requires_grad)
    ref = rand_points(2, 9, gen, dtype=dtype, device=device).requires_grad_(requires_grad)
    lengths = torch.tensor([9, 4], device=device)
    torch.library.opcheck(op, (query, ref, 0.5, 4))
    torch.library.opcheck(op, (query, ref, 0.5, 4, None, lengths))


def test_registered_with_its_schema():
    assert op._schema.name == "pcops::ball_query_dist2"
    assert [a.name for a in op._schema.arguments] == ["query", "ref", "radius", "nsample",
                                                      "query_lengths", "ref_lengths"]
    assert "ball_query_dist2" in pcops.__all__


def test_bad_inputs_raise_clear_errors(device, gen):
    q, r = rand_points(2, 6, gen, device=device), rand_points(2, 9, gen, device=device)
    cases = [
        ((q[0], r, 0.5, 4), ValueError, r"'query' must be a tensor of shape \[B, M, D\] with D >= 1"),
        ((q, r[..., :2], 0.5, 4), ValueError, r"'ref' must have 3 \(the point dimension D of 'query'\)"),
        ((q, r.double(), 0.5, 4), TypeError, r"'ref' must have the dtype of 'query'"),
        ((q, r[:1], 0.5, 4), ValueError, r"'ref' .*batch size B of 'query'"),
        ((q, r, 0.0, 4), ValueError, r"'radius' must be"),
        ((q, r, float("nan"), 4), ValueError, r"'radius' must be"),
        ((q, r, 0.5, 0), ValueError, r"'nsample' must be >= 1, got 0"),
        ((q, r, 0.5, 4, torch.tensor([1], device=device)), ValueError, r"'query_lengths'"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=r"pcops\.ball_query_dist2: .*" + pattern):
            op(*args)


def test_compiles(device, gen):
    q, r = rand_points(2, 6, gen, device=device), rand_points(2, 9, gen, device=device)
    fn = torch.compile(lambda a, b: pcops.ball_query_dist2(a, b, 0.5, 4)[0] + 1.0, fullgraph=True)
    assert_equal(fn(q, r), op(q, r, 0.5, 4)[0] + 1.0, what="compiled")
