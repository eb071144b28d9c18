"""pcops.compat.pytorch3d against float64 brute-force references that follow PyTorch3D's
documented conventions (the cases of its test_knn / test_ball_query /
test_sample_farthest_points: heterogeneous lengths, K larger than the cloud, return_nn,
gradients, errors), and PyTorch3D-style client code run after install("pytorch3d")."""
import sys

import pytest
import torch

import pcops
import pcops.compat
from pcops.compat import pytorch3d as p3d
from helpers import assert_close, assert_equal, rand_points


def lengths_or_full(lengths, B, P):
    return torch.full((B,), P, dtype=torch.long) if lengths is None else lengths.cpu()


def knn_naive(p1, p2, K, lengths1=None, lengths2=None):
    """Squared distances (float64) and indices of the K nearest, padded with 0 / 0 past
    lengths2[b] and for the points of p1 past lengths1[b] (PyTorch3D's padding)."""
    a, b = p1.detach().cpu().double(), p2.detach().cpu().double()
    B, P1, _ = a.shape
    l1, l2 = lengths_or_full(lengths1, B, P1), lengths_or_full(lengths2, B, b.shape[1])
    dists = torch.zeros(B, P1, K, dtype=torch.float64)
    idx = torch.zeros(B, P1, K, dtype=torch.long)
    for n in range(B):
        d2 = ((a[n, : l1[n], None] - b[n, None, : l2[n]]) ** 2).sum(-1)
        k = min(K, int(l2[n]))
        if k and l1[n]:
            v, i = d2.topk(k, dim=-1, largest=False, sorted=True)
            dists[n, : l1[n], :k], idx[n, : l1[n], :k] = v, i
    return dists, idx


def ball_query_naive(p1, p2, K, radius, lengths1=None, lengths2=None):
    """First K points in index order with d2 < r**2; idx -1 / dists 0 in empty slots."""
    a, b = p1.detach().cpu().double(), p2.detach().cpu().double()
    B, P1, _ = a.shape
    l1, l2 = lengths_or_full(lengths1, B, P1), lengths_or_full(lengths2, B, b.shape[1])
    dists = torch.zeros(B, P1, K, dtype=torch.float64)
    idx = torch.full((B, P1, K), -1, dtype=torch.long)
    for n in range(B):
        d2 = ((a[n, : l1[n], None] - b[n, None, : l2[n]]) ** 2).sum(-1)
        for i in range(int(l1[n])):
            found = torch.nonzero(d2[i] < radius * radius).flatten()[:K]
            idx[n, i, : len(found)] = found
            dists[n, i, : len(found)] = d2[i, found]
    return dists, idx


def fps_naive(points, lengths, K, start=None):
    """Greedy FPS per cloud in float64 from start[b] (default 0); -1 past min(K, lengths)."""
    x = points.detach().cpu().double()
    B, P, _ = x.shape
    lengths = lengths_or_full(lengths, B, P)
    Ks = [K] * B if isinstance(K, int) else [int(k) for k in K]
    out = torch.full((B, max(Ks)), -1, dtype=torch.long)
    for b in range(B):
        L = int(lengths[b])
        d = torch.full((L,), float("inf"), dtype=torch.float64)
        cur = 0 if start is None else int(start[b])
        for j in range(min(Ks[b], L)):
            out[b, j] = cur
            d = torch.minimum(d, ((x[b, :L] - x[b, cur]) ** 2).sum(-1))
            d[out[b, : j + 1]] = -1
            cur = int(torch.argmax(d))
    return out


# ----------------------------------------------------------------------------------------------
# knn_points / knn_gather

@pytest.mark.parametrize("B,P1,P2,K", [(1, 1, 1, 1), (2, 30, 50, 4), (3, 64, 7, 10), (2, 100, 300, 33)])
@pytest.mark.parametrize("hetero", [False, True])
def test_knn_points_matches_naive(device, gen, B, P1, P2, K, hetero):
    p1 = rand_points(B, P1, gen, dtype=torch.float64, device=device)
    p2 = rand_points(B, P2, gen, dtype=torch.float64, device=device)
    l1 = torch.randint(0, P1 + 1, (B,), generator=gen).to(device) if hetero else None
    l2 = torch.randint(0, P2 + 1, (B,), generator=gen).to(device) if hetero else None
    out = p3d.knn_points(p1, p2, l1, l2, K=K, return_nn=True)
    rd, ri = knn_naive(p1, p2, K, l1, l2)
    assert isinstance(out, p3d.KNN) and out._fields == ("dists", "idx", "knn")
    assert out.idx.dtype == torch.long and out.dists.shape == (B, P1, K)
    assert_equal(out.idx, ri.to(device), what="knn idx")
    assert_close(out.dists, rd, atol=1e-12, rtol=1e-12, what="knn dists")
    # knn == knn_gather(p2, idx, lengths2): zeros where k >= lengths2
    assert out.knn.shape == (B, P1, K, 3)
    exp = torch.gather(p2[:, :, None].expand(-1, -1, K, -1), 1,
                       out.idx[..., None].expand(-1, -1, -1, 3))
    if l2 is not None:
        exp = exp.masked_fill((torch.arange(K, device=device) >= l2[:, None])[:, None, :, None], 0)
    assert_equal(out.knn, exp, what="knn_gather")
    assert p3d.knn_points(p1, p2, K=K).knn is None


@pytest.mark.parametrize("D", [2, 3, 8])
def test_knn_points_unsorted(device, gen, D):
    """return_sorted=False: the same K neighbours as the sorted call, by ascending index, empty
    slots (a ragged p2 shorter than K: idx and dists 0) after them; gradients follow the slots."""
    p1 = torch.rand(2, 30, D, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    p2 = torch.rand(2, 40, D, generator=gen, dtype=torch.float64).to(device)
    l2 = torch.tensor([40, 5], device=device)
    srt = p3d.knn_points(p1, p2, lengths2=l2, K=8)
    uns = p3d.knn_points(p1, p2, lengths2=l2, K=8, return_sorted=False)
    valid = torch.arange(8, device=device) < l2[:, None, None]
    key = srt.idx.masked_fill(~valid, 10**9)
    order = key.argsort(dim=2)
    assert_equal(uns.idx, srt.idx.gather(2, order), what="unsorted idx")
    assert_equal(uns.dists, srt.dists.gather(2, order), what="unsorted dists")
    assert not torch.equal(uns.idx[0], srt.idx[0])  # index order is not distance order here
    assert bool((uns.idx[:, :, 1:] >= uns.idx[:, :, :-1])[valid[..., 1:].expand_as(uns.idx[:, :, 1:])].all())
    g = torch.randn(2, 30, 8, generator=gen, dtype=torch.float64).to(device)
    (ga,) = torch.autograd.grad(uns.dists, p1, g)
    (gb,) = torch.autograd.grad(srt.dists, p1, g.gather(2, order.argsort(dim=2)))
    assert_close(ga, gb, atol=1e-12, what="grad through the unsorted slots")


def test_knn_points_gradients(device, gen):
    p1 = rand_points(2, 20, gen, dtype=torch.float64, device=device).requires_grad_()
    p2 = rand_points(2, 15, gen, dtype=torch.float64, device=device).requires_grad_()
    l2 = torch.tensor([15, 4], device=device)
    out = p3d.knn_points(p1, p2, lengths2=l2, K=6)
    g = torch.randn(2, 20, 6, generator=gen, dtype=torch.float64).to(device)
    ga, gb = torch.autograd.grad(out.dists, (p1, p2), g)
    idx = out.idx
    nn = torch.gather(p2[:, :, None].expand(-1, -1, 6, -1), 1, idx[..., None].expand(-1, -1, -1, 3))
    ref = ((p1[:, :, None] - nn) ** 2).sum(-1)
    ref = ref.masked_fill((torch.arange(6, device=device) >= l2[:, None])[:, None], 0)
    ra, rb = torch.autograd.grad(ref, (p1, p2), g)
    assert_close(ga, ra, atol=1e-10, what="grad p1")
    assert_close(gb, rb, atol=1e-10, what="grad p2")


def test_knn_points_lower_dims_and_errors(device, gen):
    p1 = torch.rand(2, 10, 2, generator=gen).to(device)
    p2 = torch.rand(2, 12, 2, generator=gen).to(device)
    out = p3d.knn_points(p1, p2, K=3, return_nn=True)
    rd, ri = knn_naive(p1, p2, 3)
    assert_equal(out.idx, ri.to(device))
    assert out.knn.shape == (2, 10, 3, 2)
    with pytest.raises(ValueError, match="Support for 1 or 2 norm"):
        p3d.knn_points(p1, p2, norm=3)


@pytest.mark.parametrize("D", [1, 2, 5, 16])
@pytest.mark.parametrize("norm", [1, 2])
def test_knn_points_any_dimension_and_norm(device, gen, D, norm):
    p1 = torch.rand(2, 10, D, generator=gen, dtype=torch.float64).to(device)
    p2 = torch.rand(2, 12, D, generator=gen, dtype=torch.float64).to(device)
    l2 = torch.tensor([12, 4], device=device)
    out = p3d.knn_points(p1, p2, None, l2, norm=norm, K=6, return_nn=True)
    diff = (p1[:, :, None] - p2[:, None]).abs()
    d = (diff ** norm).sum(-1)
    d[1, :, 4:] = float("inf")
    rd, ri = d.sort(dim=-1, stable=True)
    rd, ri = rd[..., :6], ri[..., :6]
    empty = torch.isinf(rd)
    assert_equal(out.idx, ri.masked_fill(empty, 0), what="idx")
    assert_close(out.dists, rd.masked_fill(empty, 0.0), atol=1e-12, rtol=1e-12, what="dists")
    assert out.knn.shape == (2, 10, 6, D)
    with pytest.raises(ValueError, match="same batch dimension"):
        p3d.knn_points(p1, p2[:1])
    with pytest.raises(ValueError, match="same point dimension"):
        p3d.knn_points(p1, torch.rand(2, 12, 3).to(device))
    with pytest.raises(ValueError, match="same batch dimension"):
        p3d.knn_gather(p2, out.idx[:1])


# ----------------------------------------------------------------------------------------------
# ball_query

@pytest.mark.parametrize("B,P1,P2,K,radius", [(1, 1, 1, 1, 0.5), (2, 40, 300, 8, 0.2),
                                              (3, 17, 50, 500, 0.4), (2, 25, 100, 5, 0.05)])
@pytest.mark.parametrize("hetero", [False, True])
def test_ball_query_matches_naive(device, gen, B, P1, P2, K, radius, hetero):
    p1 = rand_points(B, P1, gen, dtype=torch.float64, device=device)
    p2 = rand_points(B, P2, gen, dtype=torch.float64, device=device)
    l1 = torch.randint(0, P1 + 1, (B,), generator=gen).to(device) if hetero else None
    l2 = torch.randint(0, P2 + 1, (B,), generator=gen).to(device) if hetero else None
    out = p3d.ball_query(p1, p2, l1, l2, K=K, radius=radius)
    rd, ri = ball_query_naive(p1, p2, K, radius, l1, l2)
    assert_equal(out.idx, ri.to(device), what="ball_query idx")
    assert_close(out.dists, rd, atol=1e-12, rtol=1e-12, what="ball_query dists")
    nn = torch.gather(p2[:, :, None].expand(-1, -1, K, -1), 1,
                      out.idx.clamp(min=0)[..., None].expand(-1, -1, -1, 3))
    assert_equal(out.knn, nn.masked_fill(out.idx[..., None] < 0, 0.0), what="ball_query nn")
    assert p3d.ball_query(p1, p2, l1, l2, K=K, radius=radius, return_nn=False).knn is None


def test_ball_query_gradients(device, gen):
    p1 = rand_points(2, 20, gen, dtype=torch.float64, device=device).requires_grad_()
    p2 = rand_points(2, 40, gen, dtype=torch.float64, device=device).requires_grad_()
    out = p3d.ball_query(p1, p2, K=7, radius=0.4)
    g = torch.randn(2, 20, 7, generator=gen, dtype=torch.float64).to(device)
    ga, gb = torch.autograd.grad(out.dists, (p1, p2), g)
    nn = torch.gather(p2[:, :, None].expand(-1, -1, 7, -1), 1,
                      out.idx.clamp(min=0)[..., None].expand(-1, -1, -1, 3))
    ref = ((p1[:, :, None] - nn) ** 2).sum(-1).masked_fill(out.idx < 0, 0.0)
    ra, rb = torch.autograd.grad(ref, (p1, p2), g)
    assert_close(ga, ra, atol=1e-10, what="grad p1")
    assert_close(gb, rb, atol=1e-10, what="grad p2")


# ----------------------------------------------------------------------------------------------
# sample_farthest_points

@pytest.mark.parametrize("B,P,K", [(1, 1, 1), (6, 5, 3), (5, 3, 7), (3, 200, 50)])
def test_sample_farthest_points_matches_naive(device, gen, B, P, K):
    """Includes clouds of fewer than 8 points in batches of more than 4 (PyTorch3D's launcher
    returns -1 for them) and K > P."""
    pts = rand_points(B, P, gen, dtype=torch.float64, device=device)
    lengths = torch.randint(1, P + 1, (B,), generator=gen).to(device)
    for lens in (None, lengths):
        sel, idx = p3d.sample_farthest_points(pts, lens, K=K)
        ref = fps_naive(pts, lens, K)
        assert_equal(idx, ref.to(device), what="fps idx")
        exp = torch.gather(pts, 1, idx.clamp(min=0)[..., None].expand(-1, -1, 3))
        assert_equal(sel, exp.masked_fill(idx[..., None] < 0, 0.0), what="fps points")


def test_sample_farthest_points_k_per_cloud(device, gen):
    pts = rand_points(3, 40, gen, device=device)
    lengths = torch.tensor([40, 10, 25], device=device)
    for K in ([5, 12, 3], torch.tensor([5, 12, 3], device=device)):
        sel, idx = p3d.sample_farthest_points(pts, lengths, K=K)
        assert idx.shape == (3, 12) and sel.shape == (3, 12, 3)
        assert_equal(idx, fps_naive(pts, lengths, [5, 12, 3]).to(device), what="fps K per cloud")
        assert (idx[0, 5:] == -1).all() and (idx[1, 10:] == -1).all() and (sel[2, 3:] == 0).all()


def test_sample_farthest_points_random_start(device, gen):
    pts = rand_points(4, 60, gen, dtype=torch.float64, device=device)
    lengths = torch.tensor([60, 1, 30, 7], device=device)
    starts = set()
    for _ in range(5):
        _, idx = p3d.sample_farthest_points(pts, lengths, K=10, random_start_point=True)
        assert ((idx[:, 0] >= 0) & (idx[:, 0] < lengths)).all()
        assert_equal(idx, fps_naive(pts, lengths, 10, start=idx[:, 0].cpu()).to(device))
        starts.add(int(idx[0, 0]))
    assert len(starts) > 1  # 5 draws out of 60 points


def test_sample_farthest_points_errors(device):
    pts = torch.rand(2, 10, 3, device=device)
    with pytest.raises(ValueError, match="lengths must have same batch dimension"):
        p3d.sample_farthest_points(pts, torch.tensor([3], device=device), K=2)
    with pytest.raises(ValueError, match="K and points must have the same batch dimension"):
        p3d.sample_farthest_points(pts, K=[1, 2, 3])


@pytest.mark.parametrize("D", [1, 2, 4, 7, 64])
def test_sample_farthest_points_any_dimension(device, gen, D):
    pts = torch.randn(3, 40, D, generator=gen, dtype=torch.float64).to(device)
    lengths = torch.tensor([40, 9, 1], device=device)
    sel, idx = p3d.sample_farthest_points(pts, lengths, K=[12, 5, 3])
    assert_equal(idx, fps_naive(pts, lengths, [12, 5, 3]).to(device), what="fps idx")
    assert sel.shape == (3, 12, D)
    exp = torch.gather(pts, 1, idx.clamp(min=0)[..., None].expand(-1, -1, D))
    assert_equal(sel, exp.masked_fill(idx[..., None] < 0, 0.0), what="fps points")
    _, idx = p3d.sample_farthest_points(pts, lengths, K=6, random_start_point=True)
    assert_equal(idx, fps_naive(pts, lengths, 6, start=idx[:, 0].cpu()).to(device),
                 what="fps idx, random start")


@pytest.mark.parametrize("D", [1, 2, 5, 16])
def test_ball_query_any_dimension(device, gen, D):
    p1 = torch.randn(2, 15, D, generator=gen, dtype=torch.float64).to(device)
    p2 = torch.randn(2, 60, D, generator=gen, dtype=torch.float64).to(device)
    radius = float(torch.cdist(p1, p2).flatten().quantile(0.2))
    l1, l2 = torch.tensor([15, 6], device=device), torch.tensor([60, 21], device=device)
    out = p3d.ball_query(p1, p2, l1, l2, K=9, radius=radius)
    rd, ri = ball_query_naive(p1, p2, 9, radius, l1, l2)
    assert_equal(out.idx, ri.to(device), what="ball_query idx")
    assert_close(out.dists, rd, atol=1e-12, rtol=1e-12, what="ball_query dists")
    nn = torch.gather(p2[:, :, None].expand(-1, -1, 9, -1), 1,
                      out.idx.clamp(min=0)[..., None].expand(-1, -1, -1, D))
    assert_equal(out.knn, nn.masked_fill(out.idx[..., None] < 0, 0.0), what="ball_query nn")


# ----------------------------------------------------------------------------------------------
# client code

def test_pytorch3d_style_client_code(device, gen):
    pcops.compat.install("pytorch3d")
    try:
        from pytorch3d.ops import ball_query, knn_gather, knn_points, sample_farthest_points
        from pytorch3d.ops.knn import knn_points as knn_points2
        assert knn_points2 is knn_points

        pts = rand_points(2, 500, gen, device=device).requires_grad_()
        lengths = torch.tensor([500, 300], device=device)
        centres, _ = sample_farthest_points(pts, lengths, K=64)
        # chamfer-like loss from the centres back to the cloud, differentiable through dists
        d, idx, _ = knn_points(centres, pts, lengths2=lengths, K=4)
        feats = knn_gather(pts, idx, lengths)  # [2, 64, 4, 3]
        bq = ball_query(centres, pts, lengths2=lengths, K=16, radius=0.2)
        loss = d.mean() + feats.square().mean() + bq.dists.sum() / (bq.idx >= 0).sum()
        loss.backward()
        assert torch.isfinite(pts.grad).all() and pts.grad.abs().sum() > 0
        assert (pts.grad[1, 300:] == 0).all()  # padded points get nothing
    finally:
        pcops.compat.uninstall("pytorch3d")
    assert "pytorch3d.ops" not in sys.modules or not getattr(
        sys.modules["pytorch3d.ops"], "__pcops_compat__", False)


def test_shims_trace_without_graph_breaks(device, gen):
    """The pointnet2_ops and PyTorch3D shims add no host synchronisation: a feature-propagation
    and grouping step written against their APIs compiles with fullgraph=True (aot_eager: the
    fake impls and the autograd formulas are traced; no C++ compiler needed)."""
    from pcops.compat import pointnet2_ops as pu

    def step(xyz, centres, feats_cf):
        d, i, _ = p3d.knn_points(centres, xyz, K=4)
        grouped = pu.grouping_operation(feats_cf, pu.ball_query(0.3, 8, xyz, centres))
        dist, idx = pu.three_nn(xyz, centres)
        w = 1.0 / (dist + 1e-8)
        up = pu.three_interpolate(grouped.amax(-1), idx, w / w.sum(-1, keepdim=True))
        return up.sum() + d.sum()

    xyz = rand_points(2, 64, gen, device=device)
    centres = xyz[:, :16].contiguous()
    feats = torch.randn(2, 5, 64, generator=gen).to(device).requires_grad_()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = compiled(xyz, centres, feats)
    out.backward()
    ref_feats = feats.detach().clone().requires_grad_()
    ref = step(xyz, centres, ref_feats)
    ref.backward()
    assert_close(out, ref, atol=1e-4, rtol=1e-5, what="compiled step")
    assert_close(feats.grad, ref_feats.grad, atol=1e-5, what="compiled grad")
