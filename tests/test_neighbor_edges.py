"""pcops.neighbor_edges: neighbour lists -> COO edges [2, E], against a plain loop, on the
searches' own outputs, with opcheck, torch.compile and input checks."""
import pytest
import torch

import pcops
from helpers import assert_equal, rand_points, random_lengths

op = torch.ops.pcops.neighbor_edges.default


def edges_naive(idx, N, count=None, row_offset=None, col_offset=None):
    """The definition, slot by slot in (b, m, s) order."""
    idx = idx.cpu()
    B, M, S = idx.shape
    rows, cols = [], []
    for b in range(B):
        r0 = int(row_offset[b]) if row_offset is not None else b * M
        c0 = int(col_offset[b]) if col_offset is not None else b * N
        for m in range(M):
            for s in range(S):
                n = int(idx[b, m, s])
                if 0 <= n < N and (count is None or s < int(count[b, m])):
                    rows.append(r0 + m)
                    cols.append(c0 + n)
    return torch.tensor([rows, cols], dtype=torch.long).view(2, -1)


def random_case(B, M, N, S, gen, device="cpu"):
    idx = torch.randint(-1, N + 2, (B, M, S), generator=gen)  # -1 and >= N are not edges
    count = torch.randint(-1, S + 2, (B, M), generator=gen)  # also < 0 and > S
    row_offset = torch.randint(0, 1000, (B,), generator=gen)
    col_offset = torch.randint(0, 1000, (B,), generator=gen)
    return [t.to(device) for t in (idx, count, row_offset, col_offset)]


@pytest.mark.parametrize("B,M,N,S", [(2, 30, 50, 8), (1, 1, 1, 1), (3, 7, 9, 33), (2, 5, 0, 4),
                                     (1, 0, 6, 3), (2, 4, 6, 0), (0, 3, 4, 5), (2, 300, 40, 70)])
def test_matches_the_definition(device, gen, B, M, N, S):
    idx, count, row_offset, col_offset = random_case(B, M, N, S, gen, device)
    for args in [(None, None, None), (count, None, None), (None, row_offset, col_offset),
                 (count, row_offset, col_offset), (count, None, col_offset)]:
        out = pcops.neighbor_edges(idx, N, *args)
        assert out.dtype == torch.long and out.device.type == device and out.is_contiguous()
        assert_equal(out.cpu(), edges_naive(idx, N, *[a if a is None else a.cpu() for a in args]),
                     what=f"edges with count/offsets given: {[a is not None for a in args]}")


def test_no_edges(device):
    idx = torch.full((2, 3, 4), -1, dtype=torch.long, device=device)
    out = pcops.neighbor_edges(idx, 10)
    assert out.shape == (2, 0) and out.dtype == torch.long


@pytest.mark.parametrize("search", ["knn", "ball_query"])
def test_edges_of_the_searches(device, gen, search):
    """What torch_cluster's knn / radius return: for each query its neighbours (knn: nearest
    first; radius: the first found, in index order), ragged clouds included."""
    B, M, N = 3, 40, 60
    query = rand_points(B, M, gen, device=device)
    ref = rand_points(B, N, gen, device=device)
    ql = random_lengths(B, M, gen, device=device)
    rl = random_lengths(B, N, gen, device=device)
    if search == "knn":
        _, idx = pcops.knn(query, ref, 8, ql, rl)
        count = None
    else:
        idx, count = pcops.ball_query(query, ref, 0.3, 8, ql, rl, return_count=True)
    out = pcops.neighbor_edges(idx, N, count)
    assert_equal(out.cpu(), edges_naive(idx, N, count), what="edges")
    # every edge is a real neighbour of a valid query
    b, m = out[0] // M, out[0] % M
    assert (m < ql[b]).all() and (out[1] - b * N < rl[b]).all()


def test_cpu_and_cuda_agree(cuda, gen):
    idx, count, row_offset, col_offset = random_case(4, 500, 300, 40, gen)
    cpu = pcops.neighbor_edges(idx, 300, count, row_offset, col_offset)
    gpu = pcops.neighbor_edges(idx.cuda(), 300, count.cuda(), row_offset.cuda(), col_offset.cuda())
    assert_equal(gpu.cpu(), cpu, what="CUDA vs CPU")


def test_non_contiguous_inputs(device, gen):
    idx, count, row_offset, col_offset = random_case(2, 6, 9, 10, gen, device)
    out = pcops.neighbor_edges(idx[:, :, ::2], 9, count.t().contiguous().t(), row_offset[::1],
                               col_offset.flip(0))
    assert_equal(out.cpu(), edges_naive(idx[:, :, ::2], 9, count.cpu(), row_offset.cpu(),
                                        col_offset.flip(0).cpu()), what="edges")


@pytest.mark.parametrize("with_optional", [False, True])
def test_opcheck(device, gen, with_optional):
    idx, count, row_offset, col_offset = random_case(2, 6, 9, 5, gen, device)
    args = (idx, 9, count, row_offset, col_offset) if with_optional else (idx, 9)
    torch.library.opcheck(op, args)


def test_registered_with_its_schema():
    assert op._schema.name == "pcops::neighbor_edges"
    assert [a.name for a in op._schema.arguments] == ["idx", "num_ref", "count", "row_offset",
                                                      "col_offset"]
    assert "neighbor_edges" in pcops.__all__


def test_bad_inputs_raise_clear_errors(device, gen):
    i, c, ro, co = random_case(2, 6, 9, 5, gen, device)
    cases = [
        ((i[0], 9), ValueError, r"'idx' must be a tensor of shape \[B, M, S\]"),
        ((i.int(), 9), TypeError, r"'idx' must be an int64 tensor, got a 3-D Int"),
        ((i.float(), 9), TypeError, r"'idx' must be an int64 tensor"),
        ((i, -1), ValueError, r"'num_ref' must be >= 0, got -1"),
        ((i, 9, c[0]), ValueError, r"'count' must be a tensor of shape \[B, M\]"),
        ((i, 9, c.int()), TypeError, r"'count' must be an int64 tensor"),
        ((i, 9, c[:1]), ValueError, r"'count' .*batch size B of 'idx'"),
        ((i, 9, c[:, :3]), ValueError, r"'count' .*M, dimension 1 of 'idx'"),
        ((i, 9, None, ro[:1]), ValueError, r"'row_offset' .*batch size B of 'idx'"),
        ((i, 9, None, None, co[None]), ValueError, r"'col_offset' must be a tensor of shape \[B\]"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=r"pcops\.neighbor_edges: .*" + pattern):
            op(*args)


def test_mixed_devices_raise(cuda, gen):
    i, c, ro, co = random_case(2, 6, 9, 5, gen, "cuda")
    with pytest.raises(ValueError, match=r"pcops\.neighbor_edges: .*'count' must be on the same device as 'idx'"):
        op(i, 9, c.cpu())
    with pytest.raises(ValueError, match=r"pcops\.neighbor_edges: .*'col_offset' must be on the same device as 'idx'"):
        op(i, 9, c, ro, co.cpu())


def test_compiles(device, gen):
    i, c, ro, co = random_case(2, 6, 9, 5, gen, device)
    fn = torch.compile(lambda a, b: pcops.neighbor_edges(a, 9, b) + 1)
    assert_equal(fn(i, c), op(i, 9, c) + 1, what="compiled")
