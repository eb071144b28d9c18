"""``pointnet2_ops.pointnet2_modules`` (Pointnet2_PyTorch) on top of pcops.compat.pointnet2_ops:
PointnetSAModuleMSG, PointnetSAModule, PointnetFPModule and build_shared_mlp, with the same
constructor arguments and channels-first tensors (features ``[B, C, N]``).

Written from the library's documented API (1x1 Conv2d + BatchNorm2d + ReLU shared MLPs, max
pooling over the neighbours, inverse-distance interpolation over the 3 nearest points); the
differences of the underlying functions are those of pcops.compat.pointnet2_ops.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import pointnet2_ops as pointnet2_utils

__pcops_compat__ = True

__all__ = ["build_shared_mlp", "PointnetSAModuleMSG", "PointnetSAModule", "PointnetFPModule"]


def build_shared_mlp(mlp_spec: List[int], bn: bool = True) -> nn.Sequential:
    """(Conv2d 1x1 -> BatchNorm2d -> ReLU) for each consecutive pair of widths in mlp_spec."""
    layers = []
    for c_in, c_out in zip(mlp_spec[:-1], mlp_spec[1:]):
        layers.append(nn.Conv2d(c_in, c_out, kernel_size=1, bias=not bn))
        if bn:
            layers.append(nn.BatchNorm2d(c_out))
        layers.append(nn.ReLU(True))
    return nn.Sequential(*layers)


class PointnetSAModuleMSG(nn.Module):
    """Set abstraction with multi-scale grouping: FPS to ``npoint`` centres (all points in one
    group when ``npoint`` is None), a ball query per (radius, nsample), a shared MLP per scale,
    max pooling; the scales' features are concatenated.

    forward(xyz [B, N, 3], features [B, C, N] or None) -> (new_xyz [B, npoint, 3] or None,
    new_features [B, sum of mlps[k][-1], npoint]). ``mlps[k][0]`` is C; 3 is added for the
    coordinates when ``use_xyz`` (the list given is not modified).
    """

    def __init__(self, npoint: Optional[int], radii: List[float], nsamples: List[int],
                 mlps: List[List[int]], bn: bool = True, use_xyz: bool = True):
        super().__init__()
        if not len(radii) == len(nsamples) == len(mlps):
            raise ValueError("radii, nsamples and mlps need one entry per scale")
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

    def forward(self, xyz: Tensor, features: Optional[Tensor]) -> Tuple[Optional[Tensor], Tensor]:
        new_xyz = None
        if self.npoint is not None:
            idx = pointnet2_utils.furthest_point_sample(xyz, self.npoint)
            new_xyz = pointnet2_utils.gather_operation(xyz.transpose(1, 2), idx).transpose(1, 2)
            new_xyz = new_xyz.contiguous()                              # [B, npoint, 3]
        outs = []
        for grouper, mlp in zip(self.groupers, self.mlps):
            f = mlp(grouper(xyz, new_xyz, features))                     # [B, C', npoint, S]
            outs.append(F.max_pool2d(f, kernel_size=[1, f.size(3)]).squeeze(-1))
        return new_xyz, torch.cat(outs, dim=1)


class PointnetSAModule(PointnetSAModuleMSG):
    """Single-scale set abstraction: ``PointnetSAModule(mlp, npoint, radius, nsample, bn,
    use_xyz)``, the MSG module with one scale."""

    def __init__(self, mlp: List[int], npoint: Optional[int] = None, radius: Optional[float] = None,
                 nsample: Optional[int] = None, bn: bool = True, use_xyz: bool = True):
        super().__init__(npoint, [radius], [nsample], [mlp], bn=bn, use_xyz=use_xyz)


class PointnetFPModule(nn.Module):
    """Feature propagation: interpolate ``known_feats [B, C2, m]`` onto the ``unknown [B, n, 3]``
    points (weights 1 / (distance + 1e-8) over the 3 nearest ``known [B, m, 3]`` points,
    normalised; ``known`` None broadcasts one point), concatenate ``unknow_feats [B, C1, n]``,
    shared MLP -> ``[B, mlp[-1], n]``."""

    def __init__(self, mlp: List[int], bn: bool = True):
        super().__init__()
        self.mlp = build_shared_mlp(mlp, bn=bn)

    def forward(self, unknown: Tensor, known: Optional[Tensor], unknow_feats: Optional[Tensor],
                known_feats: Tensor) -> Tensor:
        if known is not None:
            dist, idx = pointnet2_utils.three_nn(unknown, known)
            dist_recip = 1.0 / (dist + 1e-8)
            weight = dist_recip / dist_recip.sum(dim=2, keepdim=True)
            interpolated = pointnet2_utils.three_interpolate(known_feats, idx, weight)
        else:
            interpolated = known_feats.expand(known_feats.shape[0], known_feats.shape[1],
                                              unknown.shape[1])
        if unknow_feats is not None:
            interpolated = torch.cat([interpolated, unknow_feats], dim=1)  # [B, C2 + C1, n]
        return self.mlp(interpolated.unsqueeze(-1)).squeeze(-1)
