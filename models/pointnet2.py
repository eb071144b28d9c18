"""PointNet++ classifiers (Qi et al., NeurIPS 2017) whose sampling and grouping run on pcops.

Shapes, channels last throughout:
    B batch, N input points, M centres (FPS samples), S neighbours per centre,
    C channels, K classes.

A set-abstraction (SA) level is the paper's four steps:
    sample   FPS picks M centres among the N points                    [B,M]
    group    ball query (or kNN) finds S neighbours of each centre,    [B,M,S]
             gathering their coordinates relative to the centre and     [B,M,S,3+C]
             their features
    MLP      a shared MLP (Linear -> BatchNorm -> ReLU per layer)      [B,M,S,C']
    pool     max over the S neighbours                                 [B,M,C']

Because the grouped tensor keeps channels last, the shared MLP is a plain matmul over the last
dim of its [B*M*S, C] view (nn.Linear), BatchNorm1d normalises that same view, and the max runs
over S; there is no permute anywhere, and torch.compile can fuse BatchNorm + ReLU + max.

The classifiers below are lists of SA configs that mirror the paper's appendix B.1, so
changing a radius is changing one number.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

import pcops

__all__ = [
    "SAConfig",
    "SSG",
    "MSG",
    "SSG_LITE",
    "SharedMLP",
    "SetAbstraction",
    "PointNet2Classifier",
    "pointnet2_ssg",
    "pointnet2_msg",
    "MODELS",
    "build_model",
]


@dataclass(frozen=True)
class SAConfig:
    """One set-abstraction level.

    npoint:   centres chosen by FPS; None groups all points into one (the last level).
    radii:    ball-query radius of each scale (one scale = SSG, several = MSG); unused by kNN.
    nsamples: neighbours S of each scale.
    mlps:     the shared-MLP widths of each scale.
    """

    npoint: Optional[int]
    radii: Tuple[float, ...]
    nsamples: Tuple[int, ...]
    mlps: Tuple[Tuple[int, ...], ...]


# PointNet++ SSG for classification (paper, appendix B.1; the authors' pointnet2_cls_ssg).
SSG = (
    SAConfig(npoint=512, radii=(0.2,), nsamples=(32,), mlps=((64, 64, 128),)),
    SAConfig(npoint=128, radii=(0.4,), nsamples=(64,), mlps=((128, 128, 256),)),
    SAConfig(npoint=None, radii=(), nsamples=(), mlps=((256, 512, 1024),)),
)

# PointNet++ MSG for classification (paper, appendix B.1; the authors' pointnet2_cls_msg).
MSG = (
    SAConfig(npoint=512, radii=(0.1, 0.2, 0.4), nsamples=(16, 32, 128),
             mlps=((32, 32, 64), (64, 64, 128), (64, 96, 128))),
    SAConfig(npoint=128, radii=(0.2, 0.4, 0.8), nsamples=(32, 64, 128),
             mlps=((64, 64, 128), (128, 128, 256), (128, 128, 256))),
    SAConfig(npoint=None, radii=(), nsamples=(), mlps=((256, 512, 1024),)),
)


# A small SSG (64/16 centres, 16 neighbours, half the widths) for quick runs on a CPU, such as
# the default `python -m models.train` on the built-in shapes (256 points per shape).
SSG_LITE = (
    SAConfig(npoint=64, radii=(0.3,), nsamples=(16,), mlps=((32, 32, 64),)),
    SAConfig(npoint=16, radii=(0.6,), nsamples=(16,), mlps=((64, 64, 128),)),
    SAConfig(npoint=None, radii=(), nsamples=(), mlps=((128, 256, 512),)),
)


class SharedMLP(nn.Sequential):
    """(Linear without bias -> BatchNorm -> ReLU) per width, applied to the last dim.

    [..., C_in] -> [..., widths[-1]]. The leading dims are flattened into one row dim, so the
    Linear is one GEMM and BatchNorm1d reduces over every row (= over B, M and S, as the paper's
    1x1 Conv2d + BatchNorm2d does) without any permute.
    """

    def __init__(self, in_channels: int, widths: Sequence[int]):
        layers = []
        for width in widths:
            layers += [nn.Linear(in_channels, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(inplace=True)]
            in_channels = width
        super().__init__(*layers)
        self.out_channels = in_channels

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        return super().forward(x.reshape(-1, x.shape[-1])).view(*lead, self.out_channels)


class SetAbstraction(nn.Module):
    """A PointNet++ set-abstraction level: sample -> group -> shared MLP -> max pool.

    One (radius, nsample, MLP) scale is the single-scale (SSG) level; several are the multi-scale
    (MSG) level, whose pooled features are concatenated. ``npoint=None`` is the group-all level:
    all N points form one group, with coordinates as they are (the centre is the origin).

    Args:
        cfg: the level's SAConfig.
        in_channels: feature channels C of the input points (0 for coordinates only).
        grouping: "ball" (ball query, the paper's choice) or "knn" (the S nearest points).
    """

    def __init__(self, cfg: SAConfig, in_channels: int, grouping: str = "ball"):
        super().__init__()
        if grouping not in ("ball", "knn"):
            raise ValueError(f"grouping must be 'ball' or 'knn', got {grouping!r}")
        if cfg.npoint is None and len(cfg.mlps) != 1:
            raise ValueError("a group-all level has exactly one MLP")
        if cfg.npoint is not None and not (len(cfg.radii) == len(cfg.nsamples) == len(cfg.mlps) >= 1):
            raise ValueError(f"radii, nsamples and mlps need one entry per scale, got {cfg}")
        self.npoint = cfg.npoint
        self.radii = tuple(float(r) for r in cfg.radii)
        self.nsamples = tuple(int(s) for s in cfg.nsamples)
        self.grouping = grouping
        self.mlps = nn.ModuleList(SharedMLP(3 + in_channels, widths) for widths in cfg.mlps)
        self.out_channels = sum(mlp.out_channels for mlp in self.mlps)

    def forward(self, xyz: Tensor, features: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """xyz [B,N,3], features [B,N,C] or None -> centres [B,M,3], features [B,M,C']
        (group-all: centres [B,1,3] of zeros, features [B,1,C'])."""
        if self.npoint is None:
            return self._group_all(xyz, features)

        # 1. sample: FPS chooses M centres; gather their coordinates
        fps_idx = pcops.furthest_point_sample(xyz, self.npoint)                   # [B,M]
        centres = pcops.group(xyz, fps_idx.unsqueeze(-1)).squeeze(2)              # [B,M,3]

        pooled = []
        for radius, nsample, mlp in zip(self.radii, self.nsamples, self.mlps):
            # 2. group: S neighbours per centre, coordinates relative to the centre + features
            if self.grouping == "ball":
                nbr = pcops.ball_query(centres, xyz, radius, nsample)             # [B,M,S]
            else:
                _, nbr = pcops.knn(centres, xyz, nsample)                         # [B,M,S]
            grouped = pcops.group(xyz, nbr) - centres.unsqueeze(2)                # [B,M,S,3]
            if features is not None:
                grouped = torch.cat(                                              # [B,M,S,3+C]
                    [grouped.to(features.dtype), pcops.group(features, nbr)], dim=-1)
            # 3. shared MLP over every (centre, neighbour) pair, 4. max pool over the S neighbours
            pooled.append(mlp(grouped).amax(dim=2))                               # [B,M,C_scale]
        return centres, torch.cat(pooled, dim=-1) if len(pooled) > 1 else pooled[0]

    def _group_all(self, xyz: Tensor, features: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        grouped = xyz if features is None else torch.cat([xyz.to(features.dtype), features], dim=-1)  # [B,N,3+C]
        pooled = self.mlps[0](grouped).amax(dim=1, keepdim=True)                  # [B,1,C']
        return xyz.new_zeros(xyz.shape[0], 1, 3), pooled


class PointNet2Classifier(nn.Module):
    """PointNet++ classifier: SA levels, then the paper's head
    FC 512 -> BN -> ReLU -> dropout -> FC 256 -> BN -> ReLU -> dropout -> FC K.

    Args:
        num_classes: K.
        levels: SA configs, the last one group-all (SSG or MSG above).
        in_channels: extra per-point input channels C (e.g. 3 for normals), 0 for xyz only.
        grouping: "ball" (paper) or "knn".
        dropout: dropout probability of the head (paper: 0.5).

    forward(xyz [B,N,3], features [B,N,C] or None) -> logits [B,K].
    """

    def __init__(self, num_classes: int, levels: Sequence[SAConfig] = SSG, in_channels: int = 0,
                 grouping: str = "ball", dropout: float = 0.5):
        super().__init__()
        if levels[-1].npoint is not None:
            raise ValueError("the last SA level of a classifier must group all points (npoint=None)")
        self.levels = tuple(levels)
        self.sa = nn.ModuleList()
        channels = in_channels
        for cfg in levels:
            self.sa.append(SetAbstraction(cfg, channels, grouping))
            channels = self.sa[-1].out_channels
        self.head = nn.Sequential(
            nn.Linear(channels, 512, bias=False), nn.BatchNorm1d(512), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(512, 256, bias=False), nn.BatchNorm1d(256), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(256, num_classes),
        )

    def forward(self, xyz: Tensor, features: Optional[Tensor] = None) -> Tensor:
        for sa in self.sa:
            xyz, features = sa(xyz, features)    # [B,512,128] -> [B,128,256] -> [B,1,1024] (SSG)
        return self.head(features.squeeze(1))     # [B,K]


def pointnet2_ssg(num_classes: int = 40, **kwargs) -> PointNet2Classifier:
    """PointNet++ SSG classifier (512/128 centres, radii 0.2/0.4, 32/64 neighbours)."""
    return PointNet2Classifier(num_classes, SSG, **kwargs)


def pointnet2_msg(num_classes: int = 40, **kwargs) -> PointNet2Classifier:
    """PointNet++ MSG classifier (radii 0.1/0.2/0.4 and 0.2/0.4/0.8)."""
    return PointNet2Classifier(num_classes, MSG, **kwargs)


MODELS = {"ssg": SSG, "msg": MSG, "ssg-lite": SSG_LITE}


def build_model(name: str, num_classes: int, **kwargs) -> PointNet2Classifier:
    """'ssg', 'msg' or 'ssg-lite' -> the classifier; kwargs go to PointNet2Classifier."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return PointNet2Classifier(num_classes, MODELS[name], **kwargs)
