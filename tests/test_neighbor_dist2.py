"""pcops.neighbor_dist2: squared distances to listed neighbours, against a float64 brute force,
bit for bit against the searches' distances, with its autograd, opcheck and input checks."""
import pytest
import torch

import pcops
from helpers import FLOAT_DTYPES, assert_close, assert_equal, rand_points

op = torch.ops.pcops.neighbor_dist2.default
TOL = {torch.float32: 1e-6, torch.float64: 1e-14, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def dist2_naive(query, ref, idx):
    """float64 loop: |q - r[idx]|^2, 0 where idx is outside [0, N)."""
    q, r, idx = query.detach().cpu().double(), ref.detach().cpu().double(), idx.cpu()
    B, M, S = idx.shape
    N = r.shape[1]
    out = torch.zeros(B, M, S, dtype=torch.float64)
    for b in range(B):
        for m in range(M):
            for s in range(S):
                n = int(idx[b, m, s])
                if 0 <= n < N:
                    out[b, m, s] = ((q[b, m] - r[b, n]) ** 2).sum()
    return out


def random_case(B, M, N, S, gen, dtype=torch.float32, device="cpu"):
    query = rand_points(B, M, gen, dtype=dtype, device=device)
    ref = rand_points(B, N, gen, dtype=dtype, device=device)
    idx = torch.randint(0, max(N, 1), (B, M, S), generator=gen)
    idx[torch.rand(B, M, S, generator=gen) < 0.2] = -1
    if N == 0:
        idx.fill_(-1)
    return query, ref, idx.to(device)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,M,N,S", [(2, 30, 50, 8), (1, 1, 1, 1), (3, 7, 9, 33), (2, 5, 0, 4),
                                     (1, 0, 6, 3), (2, 4, 6, 0)])
def test_matches_float64_reference(device, gen, dtype, idx_dtype, B, M, N, S):
    query, ref, idx = random_case(B, M, N, S, gen, dtype, device)
    idx = idx.to(idx_dtype)
    out = pcops.neighbor_dist2(query, ref, idx)
    assert out.shape == (B, M, S) and out.dtype == dtype and out.device.type == device
    assert_close(out, dist2_naive(query, ref, idx), atol=TOL[dtype], rtol=TOL[dtype] * 4,
                 what="neighbor_dist2")
    if idx_dtype == torch.int32:
        assert_equal(out, pcops.neighbor_dist2(query, ref, idx.long()), what="int32 vs int64")


def test_out_of_range_indices_give_zero(device, gen):
    """The contract: anything outside [0, N) is an empty slot (0), not an error, so the op
    needs no value check (no host synchronisation on CUDA)."""
    query, ref, idx = random_case(2, 6, 10, 5, gen, device=device)
    idx[0, 0] = torch.tensor([-1, -7, 10, 11, 2**40])
    out = pcops.neighbor_dist2(query, ref, idx)
    assert (out[0, 0] == 0).all()
    assert_close(out, dist2_naive(query, ref, idx), atol=1e-6, what="neighbor_dist2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bits_of_knn_and_ball_query(device, gen, dtype):
    """The searches' arithmetic: knn's dist2 of its neighbours, bit for bit, and ball query
    neighbours strictly inside the radius as the search decided."""
    query = rand_points(2, 300, gen, dtype=dtype, device=device, scale=100.0, offset=-50.0)
    ref = rand_points(2, 500, gen, dtype=dtype, device=device, scale=100.0, offset=-50.0)
    d2, idx = pcops.knn(query, ref, 9)
    assert_equal(pcops.neighbor_dist2(query, ref, idx), d2, what="neighbor_dist2 vs knn dist2")
    assert_equal(pcops.neighbor_dist2(query, ref, idx.int()), d2, what="int32 idx vs knn dist2")
    radius = 9.0
    bidx = pcops.ball_query(query, ref, radius, 16)
    got = pcops.neighbor_dist2(query, ref, bidx)
    r2 = torch.tensor(radius, dtype=torch.float64).pow(2).to(dtype)
    assert bool((got[bidx >= 0] < r2.to(device)).all())


def test_cpu_and_cuda_give_the_same_bits(cuda, gen):
    for dtype in (torch.float32, torch.float64, torch.float16):
        query, ref, idx = random_case(3, 700, 900, 17, gen, dtype)
        for idx_dtype in (torch.int64, torch.int32):
            i = idx.to(idx_dtype)
            cpu = pcops.neighbor_dist2(query, ref, i)
            gpu = pcops.neighbor_dist2(query.cuda(), ref.cuda(), i.cuda())
            assert_equal(gpu, cpu, what=f"CUDA vs CPU {dtype} idx {idx_dtype}")


def test_non_contiguous_inputs(device, gen):
    query, ref, idx = random_case(2, 20, 30, 6, gen, device=device)
    q_t = query.transpose(1, 2).contiguous().transpose(1, 2)
    i_t = idx.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_t.is_contiguous() and not i_t.is_contiguous()
    assert_equal(pcops.neighbor_dist2(q_t, ref, i_t), pcops.neighbor_dist2(query, ref, idx))


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_gradcheck_float64(device, gen, idx_dtype):
    query, ref, idx = random_case(2, 5, 7, 4, gen, torch.float64, device)
    idx[0, 0] = torch.tensor([2, 2, -1, 2])  # one ref taken several times by one query
    idx[1, 1, 0] = 7  # out of range: 0, no gradient
    query.requires_grad_(True)
    ref.requires_grad_(True)
    idx = idx.to(idx_dtype)
    assert torch.autograd.gradcheck(pcops.neighbor_dist2, (query, ref, idx))
    assert torch.autograd.gradgradcheck(pcops.neighbor_dist2, (query, ref, idx))


def test_gradients_match_reference_and_are_deterministic(device, gen):
    query, ref, idx = random_case(2, 200, 40, 16, gen, device=device)
    query.requires_grad_(True)
    ref.requires_grad_(True)
    g = torch.randn(2, 200, 16, generator=gen).to(device)
    runs = [torch.autograd.grad(pcops.neighbor_dist2(query, ref, idx), (query, ref), g)
            for _ in range(3)]
    for gq, gr in runs[1:]:
        assert_equal(gq, runs[0][0], what="grad query, run to run")
        assert_equal(gr, runs[0][1], what="grad ref, run to run")
    q64 = query.detach().double().cpu().requires_grad_(True)
    r64 = ref.detach().double().cpu().requires_grad_(True)
    i = idx.cpu()
    nb = torch.gather(r64[:, :, None].expand(-1, -1, 16, -1), 1,
                      i.clamp(min=0)[..., None].expand(-1, -1, -1, 3))
    ref_d = ((q64[:, :, None] - nb) ** 2).sum(-1).masked_fill(i < 0, 0.0)
    rq, rr = torch.autograd.grad(ref_d, (q64, r64), g.double().cpu())
    assert_close(runs[0][0], rq, atol=1e-4, rtol=1e-5, what="grad query")
    assert_close(runs[0][1], rr, atol=1e-4, rtol=1e-5, what="grad ref")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_gradients(device, gen, dtype):
    query, ref, idx = random_case(2, 10, 12, 5, gen, dtype, device)
    query.requires_grad_(True)
    ref.requires_grad_(True)
    gq, gr = torch.autograd.grad(pcops.neighbor_dist2(query, ref, idx).sum(), (query, ref))
    assert gq.dtype == dtype and gr.dtype == dtype
    q64 = query.detach().double().requires_grad_(True)
    r64 = ref.detach().double().requires_grad_(True)
    eq, er = torch.autograd.grad(pcops.neighbor_dist2(q64, r64, idx).sum(), (q64, r64))
    assert_close(gq, eq, atol=0.05, rtol=0.02, what="half grad query")
    assert_close(gr, er, atol=0.05, rtol=0.02, what="half grad ref")


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_opcheck(device, gen, requires_grad, dtype, idx_dtype):
    query, ref, idx = random_case(2, 6, 9, 5, gen, dtype, device)
    query.requires_grad_(requires_grad)
    ref.requires_grad_(requires_grad)
    torch.library.opcheck(op, (query, ref, idx.to(idx_dtype)))


def test_registered_with_its_schema():
    assert op._schema.name == "pcops::neighbor_dist2"
    assert [a.name for a in op._schema.arguments] == ["query", "ref", "idx"]
    assert "neighbor_dist2" in pcops.__all__


def test_bad_inputs_raise_clear_errors(device, gen):
    q, r, i = random_case(2, 6, 9, 5, gen, device=device)
    cases = [
        ((q[0], r, i), ValueError, r"'query' must be a tensor of shape \[B, M, 3\]"),
        ((q[..., :2], r, i), ValueError, r"'query' must be a tensor of shape \[B, M, 3\]"),
        ((q, r[0], i), ValueError, r"'ref' must be a tensor of shape \[B, N, 3\]"),
        ((q, r.double(), i), TypeError, r"'ref' must have the dtype of 'query'"),
        ((q.long(), r.long(), i), TypeError, r"'query' must be a floating point"),
        ((q, r[:1], i), ValueError, r"'ref' .*batch size B of 'query'"),
        ((q, r, i.float()), TypeError, r"'idx' must be an int64 or int32 tensor, got a 3-D Float"),
        ((q, r, i.short()), TypeError, r"'idx' must be an int64 or int32 tensor, got a 3-D Short"),
        ((q, r, i[0]), ValueError, r"'idx' must be a tensor of shape \[B, M, S\]"),
        ((q, r, i[:1]), ValueError, r"'idx' .*batch size B of 'query'"),
        ((q, r, i[:, :3]), ValueError, r"'idx' .*M, dimension 1 of 'query'"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=r"pcops\.neighbor_dist2: .*" + pattern):
            op(*args)
    big = torch.zeros(1, 1, 1, dtype=torch.long, device=device).expand(1, 6, 2**40)
    with pytest.raises(ValueError, match=r"pcops\.neighbor_dist2: argument 'idx' asks for an output"):
        op(q[:1], r[:1], big)


def test_mixed_devices_raise(cuda, gen):
    q, r, i = random_case(2, 6, 9, 5, gen)
    with pytest.raises(ValueError, match=r"pcops\.neighbor_dist2: .*'ref' must be on the same device as 'query'"):
        op(q.cuda(), r, i.cuda())
    with pytest.raises(ValueError, match=r"pcops\.neighbor_dist2: .*'idx' must be on the same device as 'query'"):
        op(q.cuda(), r.cuda(), i)
    with pytest.raises(ValueError, match=r"pcops\.neighbor_dist2: .*'query' is .* while another argument is on CUDA"):
        op(q, r.cuda(), i.cuda())


def test_cuda_graph_capture(cuda, gen):
    """No host synchronisation: captured, then replayed on new values."""
    q, r, i = random_case(2, 50, 70, 8, gen, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(q, r, i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(q, r, i)
    q.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert_equal(out, op(q, r, i), what="replayed graph")


def test_compiles(device, gen):
    q, r, i = random_case(2, 6, 9, 5, gen, device=device)
    fn = torch.compile(lambda a, b, c: pcops.neighbor_dist2(a, b, c) + 1.0, fullgraph=True)
    assert_equal(fn(q, r, i), op(q, r, i) + 1.0, what="compiled")
