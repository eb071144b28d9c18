"""pcops.compat.pointnet2_ops against float64 brute-force references that follow
pointnet2_ops's documented conventions, and client code written against its API
(set abstraction with QueryAndGroup / GroupAll, MSG, feature propagation) run unchanged after
pcops.compat.install("pointnet2_ops")."""
import importlib
import sys
import textwrap
import types

import pytest
import torch

import pcops
import pcops.compat
from pcops.compat import pointnet2_ops as pu
from helpers import assert_close, assert_equal, clustered_points, rand_points


# ----------------------------------------------------------------------------------------------
# references (float64 loops / plain torch, written from pointnet2_ops's documented behaviour)

def fps_naive(xyz, npoint):
    """Greedy FPS from index 0, distances from +inf, ties to the lower index."""
    x = xyz.detach().cpu().double()
    B, N, _ = x.shape
    out = torch.full((B, npoint), -1, dtype=torch.long)
    for b in range(B):
        d = torch.full((N,), float("inf"), dtype=torch.float64)
        chosen = torch.zeros(N, dtype=torch.bool)
        cur = 0
        for j in range(min(npoint, N)):
            out[b, j] = cur
            chosen[cur] = True
            d = torch.minimum(d, ((x[b] - x[b, cur]) ** 2).sum(-1))
            d[chosen] = -1
            cur = int(torch.argmax(d))  # first maximum
    return out


def ball_query_naive(radius, nsample, xyz, new_xyz):
    """First nsample points with d2 < r**2 in index order; empty slots repeat the first; a
    centre with no neighbour gets 0 everywhere."""
    x, c = xyz.detach().cpu().double(), new_xyz.detach().cpu().double()
    B, M = c.shape[:2]
    out = torch.zeros(B, M, nsample, dtype=torch.long)
    for b in range(B):
        d2 = ((c[b][:, None] - x[b][None]) ** 2).sum(-1)
        for m in range(M):
            found = torch.nonzero(d2[m] < radius * radius).flatten()[:nsample]
            if len(found):
                out[b, m] = found[0]
                out[b, m, :len(found)] = found
    return out


def three_nn_naive(unknown, known):
    a, b = unknown.detach().cpu().double(), known.detach().cpu().double()
    d2 = ((a[:, :, None] - b[:, None]) ** 2).sum(-1)  # exact 0 for coincident points
    d, i = d2.topk(3, dim=-1, largest=False, sorted=True)
    return d.sqrt(), i


class TorchRef(types.SimpleNamespace):
    """pointnet2_utils written with plain differentiable torch ops (for client-code checks)."""


def _torch_ref():
    def gather_operation(features, idx):
        return torch.gather(features, 2, idx.long()[:, None, :].expand(-1, features.shape[1], -1))

    def grouping_operation(features, idx):
        B, C, N = features.shape
        _, M, S = idx.shape
        flat = idx.long().reshape(B, 1, M * S).expand(-1, C, -1)
        return torch.gather(features, 2, flat).view(B, C, M, S)

    def three_interpolate(features, idx, weight):
        g = grouping_operation(features, idx)  # [B, C, n, 3]
        return (g * weight[:, None]).sum(-1)

    def ball_query(radius, nsample, xyz, new_xyz):
        return ball_query_naive(radius, nsample, xyz, new_xyz).to(xyz.device).int()

    def furthest_point_sample(xyz, npoint):
        return fps_naive(xyz, npoint).to(xyz.device).int()

    def three_nn(unknown, known):
        d, i = three_nn_naive(unknown, known)
        return d.to(unknown.dtype).to(unknown.device), i.int().to(unknown.device)

    class QueryAndGroup(torch.nn.Module):
        def __init__(self, radius, nsample, use_xyz=True):
            super().__init__()
            self.radius, self.nsample, self.use_xyz = radius, nsample, use_xyz

        def forward(self, xyz, new_xyz, features=None):
            idx = ball_query(self.radius, self.nsample, xyz, new_xyz)
            gx = grouping_operation(xyz.transpose(1, 2), idx) - new_xyz.transpose(1, 2)[..., None]
            if features is None:
                return gx
            gf = grouping_operation(features, idx)
            return torch.cat([gx, gf], 1) if self.use_xyz else gf

    class GroupAll(torch.nn.Module):
        def __init__(self, use_xyz=True):
            super().__init__()
            self.use_xyz = use_xyz

        def forward(self, xyz, new_xyz, features=None):
            gx = xyz.transpose(1, 2).unsqueeze(2)
            if features is None:
                return gx
            return torch.cat([gx, features.unsqueeze(2)], 1) if self.use_xyz else features.unsqueeze(2)

    return TorchRef(**{k: v for k, v in locals().items() if not k.startswith("_")})


# ----------------------------------------------------------------------------------------------
# functions

def test_furthest_point_sample_int32_and_exact(device, gen):
    xyz = rand_points(3, 300, gen, dtype=torch.float64, device=device)
    idx = pu.furthest_point_sample(xyz, 64)
    assert idx.dtype == torch.int32 and idx.shape == (3, 64) and idx.device.type == device
    assert_equal(idx.long(), fps_naive(xyz, 64).to(device), what="fps idx")
    xyz32 = xyz.float()
    assert_equal(pu.furthest_point_sample(xyz32, 64).long(),
                 pcops.furthest_point_sample(xyz32, 64), what="fps float32 vs raw op")


def test_furthest_point_sample_keeps_points_at_the_origin(device):
    """pointnet2_ops skips every point with x*x + y*y + z*z <= 1e-3; pcops does not."""
    xyz = torch.tensor([[[1.0, 0, 0], [-1.0, 0, 0], [0.0, 0, 0], [0.5, 0, 0]]], device=device)
    assert pu.furthest_point_sample(xyz, 3).tolist() == [[0, 1, 2]]


def test_gather_operation_and_grad(device, gen):
    feats = torch.randn(2, 5, 40, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    idx = torch.randint(0, 40, (2, 17), generator=gen).int().to(device)
    out = pu.gather_operation(feats, idx)
    ref = _torch_ref().gather_operation(feats, idx)
    assert out.shape == (2, 5, 17)
    assert_equal(out, ref, what="gather_operation")
    g = torch.randn(2, 5, 17, generator=gen, dtype=torch.float64).to(device)
    assert_close(torch.autograd.grad(out, feats, g)[0], torch.autograd.grad(ref, feats, g)[0],
                 atol=1e-12, what="gather_operation grad")
    # int64 indices work too
    assert_equal(pu.gather_operation(feats, idx.long()), out)


@pytest.mark.parametrize("nsample", [1, 8, 40])
def test_ball_query_pointnet2_padding(device, gen, nsample):
    xyz = rand_points(2, 200, gen, dtype=torch.float64, device=device)
    centres = torch.cat([xyz[:, :30], torch.full((2, 3, 3), 5.0, dtype=torch.float64,
                                                 device=device)], 1)  # 3 centres with none
    idx = pu.ball_query(0.15, nsample, xyz, centres)
    assert idx.dtype == torch.int32 and idx.shape == (2, 33, nsample)
    assert_equal(idx.long(), ball_query_naive(0.15, nsample, xyz, centres).to(device),
                 what="ball_query idx")
    assert (idx[:, 30:] == 0).all()  # no neighbour: zeros, as pointnet2_ops


def test_grouping_operation_and_grad(device, gen):
    feats = torch.randn(2, 6, 50, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    idx = torch.randint(0, 50, (2, 12, 9), generator=gen).int().to(device)
    out = pu.grouping_operation(feats, idx)
    ref = _torch_ref().grouping_operation(feats, idx)
    assert out.shape == (2, 6, 12, 9)
    assert_equal(out, ref, what="grouping_operation")
    g = torch.randn(2, 6, 12, 9, generator=gen, dtype=torch.float64).to(device)
    assert_close(torch.autograd.grad(out, feats, g)[0], torch.autograd.grad(ref, feats, g)[0],
                 atol=1e-12, what="grouping_operation grad")
    # client code subtracts in place from the grouped coordinates (QueryAndGroup does)
    out2 = pu.grouping_operation(feats, idx)
    out2 -= 1.0
    out2.sum().backward()


def test_three_nn_distances_are_euclidean(device, gen):
    unknown = rand_points(2, 80, gen, dtype=torch.float64, device=device)
    known = rand_points(2, 20, gen, dtype=torch.float64, device=device)
    dist, idx = pu.three_nn(unknown, known)
    rd, ri = three_nn_naive(unknown, known)
    assert idx.dtype == torch.int32 and dist.shape == (2, 80, 3)
    assert_equal(idx.long(), ri.to(device), what="three_nn idx")
    assert_close(dist, rd, atol=1e-12, rtol=1e-12, what="three_nn dist (not squared)")
    # fewer than 3 known points: index 0 and distance inf in the missing slots, as there
    dist2, idx2 = pu.three_nn(unknown, known[:, :2])
    assert (idx2[..., 2] == 0).all() and torch.isinf(dist2[..., 2]).all()


def test_three_interpolate_and_grad(device, gen):
    feats = torch.randn(2, 7, 20, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    idx = torch.randint(0, 20, (2, 60, 3), generator=gen).int().to(device)
    weight = torch.rand(2, 60, 3, generator=gen, dtype=torch.float64).to(device)
    out = pu.three_interpolate(feats, idx, weight)
    ref = _torch_ref().three_interpolate(feats, idx, weight)
    assert out.shape == (2, 7, 60)
    assert_close(out, ref, atol=1e-12, what="three_interpolate")
    g = torch.randn(2, 7, 60, generator=gen, dtype=torch.float64).to(device)
    assert_close(torch.autograd.grad(out, feats, g)[0], torch.autograd.grad(ref, feats, g)[0],
                 atol=1e-12, what="three_interpolate grad")


@pytest.mark.parametrize("use_xyz", [True, False])
def test_query_and_group(device, gen, use_xyz):
    xyz = clustered_points(2, 120, gen, dtype=torch.float64, device=device)
    new_xyz = xyz[:, :16]
    feats = torch.randn(2, 4, 120, generator=gen, dtype=torch.float64).to(device)
    out = pu.QueryAndGroup(0.3, 10, use_xyz=use_xyz)(xyz, new_xyz, feats)
    ref = _torch_ref().QueryAndGroup(0.3, 10, use_xyz=use_xyz)(xyz, new_xyz, feats)
    assert out.shape == ((2, 7, 16, 10) if use_xyz else (2, 4, 16, 10))
    assert_close(out, ref, atol=1e-12, what="QueryAndGroup")
    only_xyz = pu.QueryAndGroup(0.3, 10)(xyz, new_xyz)
    assert_close(only_xyz, ref[:, :3] if use_xyz else
                 _torch_ref().QueryAndGroup(0.3, 10)(xyz, new_xyz), atol=1e-12)
    with pytest.raises(ValueError):
        pu.QueryAndGroup(0.3, 10, use_xyz=False)(xyz, new_xyz)
    feats_, gx, cnt = pu.QueryAndGroup(0.3, 10, ret_grouped_xyz=True, normalize_xyz=True,
                                       ret_unique_cnt=True)(xyz, new_xyz, feats)
    assert_close(gx, ref_xyz := _torch_ref().QueryAndGroup(0.3, 10)(xyz, new_xyz) / 0.3,
                 atol=1e-12, what="normalize_xyz")
    assert_close(feats_[:, :3], ref_xyz, atol=1e-12)
    d2 = torch.cdist(new_xyz, xyz).pow(2)
    assert_equal(cnt, (d2 < 0.09).sum(-1).clamp(max=10), what="unique count")
    with pytest.raises(NotImplementedError, match="sample_uniformly"):
        pu.QueryAndGroup(0.3, 10, sample_uniformly=True)


def test_group_all(device, gen):
    xyz = rand_points(2, 30, gen, device=device)
    feats = torch.randn(2, 5, 30, generator=gen).to(device)
    out = pu.GroupAll()(xyz, None, feats)
    assert out.shape == (2, 8, 1, 30)
    assert_equal(out, _torch_ref().GroupAll()(xyz, None, feats))
    assert pu.GroupAll(use_xyz=False)(xyz, None, feats).shape == (2, 5, 1, 30)
    assert pu.GroupAll()(xyz, None).shape == (2, 3, 1, 30)


# ----------------------------------------------------------------------------------------------
# client code, written from Pointnet2_PyTorch's documented module API, run unchanged

CLIENT = textwrap.dedent('''
    from typing import List
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from pointnet2_ops import pointnet2_utils


    def build_shared_mlp(spec: List[int], bn: bool = True):
        layers = []
        for i in range(1, len(spec)):
            layers.append(nn.Conv2d(spec[i - 1], spec[i], kernel_size=1, bias=not bn))
            if bn:
                layers.append(nn.BatchNorm2d(spec[i]))
            layers.append(nn.ReLU(True))
        return nn.Sequential(*layers)


    class PointnetSAModuleMSG(nn.Module):
        def __init__(self, npoint, radii, nsamples, mlps, bn=True, use_xyz=True):
            super().__init__()
            self.npoint = npoint
            self.groupers = nn.ModuleList()
            self.mlps = nn.ModuleList()
            for radius, nsample, spec in zip(radii, nsamples, mlps):
                self.groupers.append(
                    pointnet2_utils.QueryAndGroup(radius, nsample, use_xyz=use_xyz)
                    if npoint is not None else pointnet2_utils.GroupAll(use_xyz))
                spec = list(spec)
                if use_xyz:
                    spec[0] += 3
                self.mlps.append(build_shared_mlp(spec, bn))

        def forward(self, xyz, features):
            xyz_flipped = xyz.transpose(1, 2).contiguous()
            new_xyz = (
                pointnet2_utils.gather_operation(
                    xyz_flipped, pointnet2_utils.furthest_point_sample(xyz, self.npoint)
                ).transpose(1, 2).contiguous()
                if self.npoint is not None else None
            )
            outs = []
            for grouper, mlp in zip(self.groupers, self.mlps):
                f = mlp(grouper(xyz, new_xyz, features))
                f = F.max_pool2d(f, kernel_size=[1, f.size(3)]).squeeze(-1)
                outs.append(f)
            return new_xyz, torch.cat(outs, dim=1)


    class PointnetSAModule(PointnetSAModuleMSG):
        def __init__(self, mlp, npoint=None, radius=None, nsample=None, bn=True, use_xyz=True):
            super().__init__(npoint, [radius], [nsample], [mlp], bn, use_xyz)


    class PointnetFPModule(nn.Module):
        def __init__(self, mlp, bn=True):
            super().__init__()
            self.mlp = build_shared_mlp(mlp, bn=bn)

        def forward(self, unknown, known, unknow_feats, known_feats):
            if known is not None:
                dist, idx = pointnet2_utils.three_nn(unknown, known)
                dist_recip = 1.0 / (dist + 1e-8)
                norm = torch.sum(dist_recip, dim=2, keepdim=True)
                weight = dist_recip / norm
                interpolated = pointnet2_utils.three_interpolate(known_feats, idx, weight)
            else:
                interpolated = known_feats.expand(*(list(known_feats.size()[0:2]) + [unknown.size(1)]))
            if unknow_feats is not None:
                new_features = torch.cat([interpolated, unknow_feats], dim=1)
            else:
                new_features = interpolated
            return self.mlp(new_features.unsqueeze(-1)).squeeze(-1)


    class SegNet(nn.Module):
        """A small PointNet++ segmentation net: SSG, MSG and group-all levels, FP back up."""

        def __init__(self, num_classes=5):
            super().__init__()
            self.sa1 = PointnetSAModule([3, 16, 16], npoint=64, radius=0.3, nsample=16)
            self.sa2 = PointnetSAModuleMSG(16, [0.4, 0.8], [8, 16], [[16, 16, 32], [16, 16, 32]])
            self.sa3 = PointnetSAModule([64, 64, 128])
            self.fp3 = PointnetFPModule([128 + 64, 64])
            self.fp2 = PointnetFPModule([64 + 16, 32])
            self.fp1 = PointnetFPModule([32 + 3, 32, 32])
            self.head = nn.Conv1d(32, num_classes, 1)

        def forward(self, xyz, features):
            l1_xyz, l1_f = self.sa1(xyz, features)
            l2_xyz, l2_f = self.sa2(l1_xyz, l1_f)
            _, l3_f = self.sa3(l2_xyz, l2_f)
            l2_f = self.fp3(l2_xyz, None, l2_f, l3_f)
            l1_f = self.fp2(l1_xyz, l2_xyz, l1_f, l2_f)
            l0_f = self.fp1(xyz, l1_xyz, features, l1_f)
            return self.head(l0_f)
''')


@pytest.fixture
def client(tmp_path):
    """Imports the client module after install("pointnet2_ops"); undoes both afterwards."""
    (tmp_path / "client_pointnet2.py").write_text(CLIENT)
    pcops.compat.install("pointnet2_ops")
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop("client_pointnet2", None)
        yield importlib.import_module("client_pointnet2")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("client_pointnet2", None)
        pcops.compat.uninstall("pointnet2_ops")


def test_install_serves_the_module():
    pcops.compat.install("pointnet2_ops")
    try:
        from pointnet2_ops import pointnet2_utils
        import pointnet2_ops.pointnet2_utils as pu2
        assert pointnet2_utils is pu and pu2 is pu
    finally:
        pcops.compat.uninstall("pointnet2_ops")
    assert "pointnet2_ops" not in sys.modules or not getattr(
        sys.modules["pointnet2_ops"], "__pcops_compat__", False)
    with pytest.raises(ValueError, match="must be one of"):
        pcops.compat.install("pointnet3")


def test_client_code_runs_forward_and_backward(client, device, gen):
    torch.manual_seed(0)
    net = client.SegNet().to(device).double()
    xyz = rand_points(2, 256, gen, dtype=torch.float64, device=device)
    feats = xyz.transpose(1, 2).contiguous().requires_grad_()
    out = net(xyz, feats)
    assert out.shape == (2, 5, 256) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert torch.isfinite(feats.grad).all() and feats.grad.abs().sum() > 0
    for p in net.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()

    # the same network on plain-torch references gives the same outputs and gradients
    feats_ref = feats.detach().clone().requires_grad_()
    client.pointnet2_utils = _torch_ref()  # before building: the SA levels make their groupers
    try:
        ref_net = client.SegNet().to(device).double()
        ref_net.load_state_dict(net.state_dict())
        assert not isinstance(ref_net.sa1.groupers[0], pu.QueryAndGroup)
        ref_out = ref_net(xyz, feats_ref)
        ref_out.square().mean().backward()
    finally:
        client.pointnet2_utils = pu
    assert_close(out, ref_out, atol=1e-9, rtol=1e-9, what="client net output")
    assert_close(feats.grad, feats_ref.grad, atol=1e-9, rtol=1e-7, what="client input grad")
    for (name, p), q in zip(net.named_parameters(), ref_net.parameters()):
        assert_close(p.grad, q.grad, atol=1e-9, rtol=1e-7, what=f"grad {name}")


def test_client_code_float32_training_step(client, device, gen):
    net = client.SegNet().to(device)
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xyz = rand_points(4, 256, gen, device=device)
    labels = (xyz[..., 0] > 0.5).long() + (xyz[..., 1] > 0.5).long()
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(net(xyz, xyz.transpose(1, 2).contiguous()), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


def test_installed_pointnet2_modules_match_the_client_modules(client, device, gen):
    """pointnet2_ops.pointnet2_modules (served by pcops.compat.pointnet2_modules) computes what
    the client's own modules compute, forward and backward."""
    from pointnet2_ops import pointnet2_modules as pm
    from pointnet2_ops.pointnet2_modules import PointnetFPModule, PointnetSAModuleMSG  # noqa: F401

    torch.manual_seed(0)
    ours = torch.nn.ModuleList([pm.PointnetSAModuleMSG(32, [0.2, 0.4], [8, 16], [[3, 8], [3, 16]]),
                                pm.PointnetSAModule([24, 32]), pm.PointnetFPModule([32 + 24, 16]),
                                pm.PointnetFPModule([16 + 3, 8])]).to(device).double()
    theirs = torch.nn.ModuleList([client.PointnetSAModuleMSG(32, [0.2, 0.4], [8, 16], [[3, 8], [3, 16]]),
                                  client.PointnetSAModule([24, 32]), client.PointnetFPModule([32 + 24, 16]),
                                  client.PointnetFPModule([16 + 3, 8])]).to(device).double()
    theirs.load_state_dict(ours.state_dict())
    xyz = rand_points(2, 128, gen, dtype=torch.float64, device=device)
    outs = []
    for net in (ours, theirs):
        feats = xyz.transpose(1, 2).contiguous().requires_grad_()
        l1_xyz, l1 = net[0](xyz, feats)
        _, l2 = net[1](l1_xyz, l1)
        up = net[2](l1_xyz, None, l1, l2)
        out = net[3](xyz, l1_xyz, feats, up)
        out.square().sum().backward()
        outs.append((out, feats.grad))
    assert outs[0][0].shape == (2, 8, 128)
    assert_close(outs[0][0], outs[1][0], atol=1e-10, what="modules output")
    assert_close(outs[0][1], outs[1][1], atol=1e-9, what="modules input grad")


def test_cuda_graph_capture_of_a_feature_propagation_step(cuda, gen):
    """three_nn + three_interpolate + QueryAndGroup add no host synchronisation: captured in a
    CUDA graph and replayed on new coordinates they give the eager results."""
    xyz = rand_points(2, 256, gen, device="cuda")
    centres = xyz[:, :32].clone()
    feats = torch.randn(2, 8, 32, generator=gen).cuda()
    qg = pu.QueryAndGroup(0.3, 16)

    def step():
        dist, idx = pu.three_nn(xyz, centres)
        w = 1.0 / (dist + 1e-8)
        up = pu.three_interpolate(feats, idx, w / w.sum(-1, keepdim=True))  # [2, 8, 256]
        return up, qg(xyz, centres, up)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    xyz.copy_(rand_points(2, 256, gen, device="cuda"))
    centres.copy_(xyz[:, :32])
    graph.replay()
    torch.cuda.synchronize()
    for got, exp in zip(outs, step()):
        assert_equal(got, exp, what="replayed step")
