"""PointNet++ segmentation (Qi et al., NeurIPS 2017, section 3.4): SSG set abstraction down,
feature propagation (FP) up, a per-point classifier on top. Sampling, grouping, the three
nearest neighbours and the interpolation all run on pcops.

Shapes, channels last throughout:
    B batch, N input points, M_l points of level l (M_0 = N), C channels, K classes.

A feature-propagation level is the paper's two steps, from a sparse level back to a denser one:
    interpolate  each dense point takes the inverse-squared-distance weighted average of the
                 features of its 3 nearest sparse points (pcops.three_nn +
                 pcops.three_interpolate; a deterministic backward)             [B,M_dense,C]
    unit PointNet concatenate the dense level's own (skip) features, then a shared MLP
                                                                                [B,M_dense,C']

Configurations mirror the authors' models, so changing a radius is changing one number:
    SEG_SSG       semantic segmentation (pointnet2_sem_seg: 1024/256/64/16 centres,
                  radii 0.1/0.2/0.4/0.8, FP 256,256 / 256,256 / 256,128 / 128,128,128)
    PART_SSG      part segmentation (pointnet2_part_seg_ssg: 512/128/all, FP 256,256 /
                  256,128 / 128,128,128, the shape category one-hot joins at the last FP)
    SEG_SSG_LITE  a small one for CPU tests and quick runs
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

import pcops
from models.pointnet2 import SAConfig, SetAbstraction, SharedMLP

__all__ = [
    "SegConfig",
    "SEG_SSG",
    "PART_SSG",
    "SEG_SSG_LITE",
    "FeaturePropagation",
    "PointNet2Seg",
    "pointnet2_seg_ssg",
    "pointnet2_part_seg_ssg",
    "build_seg_model",
]


@dataclass(frozen=True)
class SegConfig:
    """levels: the SA levels, dense to sparse; fp_mlps: the shared-MLP widths of each FP level,
    sparse to dense (one per SA level); head: widths of the per-point MLP before the classifier."""

    levels: Tuple[SAConfig, ...]
    fp_mlps: Tuple[Tuple[int, ...], ...]
    head: Tuple[int, ...] = (128,)


SEG_SSG = SegConfig(
    levels=(
        SAConfig(npoint=1024, radii=(0.1,), nsamples=(32,), mlps=((32, 32, 64),)),
        SAConfig(npoint=256, radii=(0.2,), nsamples=(32,), mlps=((64, 64, 128),)),
        SAConfig(npoint=64, radii=(0.4,), nsamples=(32,), mlps=((128, 128, 256),)),
        SAConfig(npoint=16, radii=(0.8,), nsamples=(32,), mlps=((256, 256, 512),)),
    ),
    fp_mlps=((256, 256), (256, 256), (256, 128), (128, 128, 128)),
)

PART_SSG = SegConfig(
    levels=(
        SAConfig(npoint=512, radii=(0.2,), nsamples=(64,), mlps=((64, 64, 128),)),
        SAConfig(npoint=128, radii=(0.4,), nsamples=(64,), mlps=((128, 128, 256),)),
        SAConfig(npoint=None, radii=(), nsamples=(), mlps=((256, 512, 1024),)),
    ),
    fp_mlps=((256, 256), (256, 128), (128, 128, 128)),
)

SEG_SSG_LITE = SegConfig(
    levels=(
        SAConfig(npoint=64, radii=(0.3,), nsamples=(16,), mlps=((16, 16, 32),)),
        SAConfig(npoint=16, radii=(0.6,), nsamples=(16,), mlps=((32, 32, 64),)),
    ),
    fp_mlps=((64, 64), (32, 32)),
    head=(32,),
)


class FeaturePropagation(nn.Module):
    """One FP level: interpolate the sparse features onto the dense points, concatenate the
    dense points' skip features, shared MLP.

    forward(xyz_dense [B,M,3], xyz_sparse [B,M',3], feats_dense [B,M,C_skip] or None,
    feats_sparse [B,M',C]) -> [B,M,widths[-1]]. A sparse level of one point (group-all) is
    broadcast to every dense point.
    """

    def __init__(self, in_channels: int, skip_channels: int, widths: Sequence[int]):
        super().__init__()
        self.mlp = SharedMLP(in_channels + skip_channels, widths)
        self.out_channels = self.mlp.out_channels

    def forward(self, xyz_dense: Tensor, xyz_sparse: Tensor, feats_dense: Optional[Tensor],
                feats_sparse: Tensor) -> Tensor:
        B, M = xyz_dense.shape[:2]
        if xyz_sparse.shape[1] == 1:
            interpolated = feats_sparse.expand(B, M, feats_sparse.shape[-1])             # [B,M,C]
        else:
            # 1. interpolate: weights 1 / d**2 of the 3 nearest sparse points (the paper's p = 2),
            #    normalised; coordinates carry no gradient here (as in the authors' code)
            dist2, idx = pcops.three_nn(xyz_dense.detach(), xyz_sparse.detach())       # [B,M,3]
            weight = 1.0 / dist2.clamp_min(1e-10)
            weight = (weight / weight.sum(-1, keepdim=True)).to(feats_sparse.dtype)
            interpolated = pcops.three_interpolate(feats_sparse, idx, weight)            # [B,M,C]
        # 2. unit PointNet on [interpolated, skip]
        if feats_dense is not None:
            interpolated = torch.cat([interpolated, feats_dense.to(interpolated.dtype)], dim=-1)
        return self.mlp(interpolated)                                                    # [B,M,C']


class PointNet2Seg(nn.Module):
    """PointNet++ segmentation network (SSG encoder, FP decoder, per-point head).

    Args:
        num_classes: K, classes per point (semantic classes or part labels).
        config: SEG_SSG, PART_SSG or SEG_SSG_LITE (or your own SegConfig).
        in_channels: extra per-point input channels C (colours, normals), 0 for xyz only.
        num_categories: for part segmentation, the number of shape categories whose one-hot
            vector joins the dense skip features (0: none).
        grouping: "ball" (paper) or "knn", for the SA levels.
        dropout: before the classifier (paper: 0.5).

    forward(xyz [B,N,3], features [B,N,C] or None, category [B] int64 or None)
    -> logits [B,N,K].
    """

    def __init__(self, num_classes: int, config: SegConfig = SEG_SSG, in_channels: int = 0,
                 num_categories: int = 0, grouping: str = "ball", dropout: float = 0.5):
        super().__init__()
        if len(config.fp_mlps) != len(config.levels):
            raise ValueError("a SegConfig needs one FP level per SA level")
        self.config = config
        self.num_categories = num_categories
        self.sa = nn.ModuleList()
        channels = [in_channels]  # feature channels of each level, dense to sparse
        for cfg in config.levels:
            self.sa.append(SetAbstraction(cfg, channels[-1], grouping))
            channels.append(self.sa[-1].out_channels)
        # level-0 skip features: xyz, the input features and the category one-hot
        channels[0] = 3 + in_channels + num_categories
        self.fp = nn.ModuleList()
        up = channels[-1]
        for i, widths in enumerate(config.fp_mlps):
            skip = channels[len(channels) - 2 - i]
            self.fp.append(FeaturePropagation(up, skip, widths))
            up = self.fp[-1].out_channels
        self.head = nn.Sequential(SharedMLP(up, config.head), nn.Dropout(dropout),
                                  nn.Linear(config.head[-1] if config.head else up, num_classes))

    def forward(self, xyz: Tensor, features: Optional[Tensor] = None,
                category: Optional[Tensor] = None) -> Tensor:
        B, N, _ = xyz.shape
        xyzs, feats = [xyz], [features]
        for sa in self.sa:                                  # down: [B,N] -> [B,M_1] -> ...
            new_xyz, new_feats = sa(xyzs[-1], feats[-1])
            xyzs.append(new_xyz)
            feats.append(new_feats)
        skip0 = [xyz] if features is None else [xyz, features.to(xyz.dtype)]
        if self.num_categories:
            if category is None:
                raise ValueError("PointNet2Seg: this model needs the shape category of each cloud")
            onehot = nn.functional.one_hot(category, self.num_categories).to(xyz.dtype)
            skip0.append(onehot.unsqueeze(1).expand(B, N, self.num_categories))
        feats[0] = torch.cat(skip0, dim=-1)
        up = feats[-1]
        for i, fp in enumerate(self.fp):                    # up: sparse -> dense, with skips
            dense = len(xyzs) - 2 - i
            up = fp(xyzs[dense], xyzs[dense + 1], feats[dense], up)
        return self.head(up)                                # [B,N,K]


def pointnet2_seg_ssg(num_classes: int = 13, **kwargs) -> PointNet2Seg:
    """PointNet++ SSG semantic segmentation (the authors' pointnet2_sem_seg)."""
    return PointNet2Seg(num_classes, SEG_SSG, **kwargs)


def pointnet2_part_seg_ssg(num_classes: int = 50, num_categories: int = 16,
                           **kwargs) -> PointNet2Seg:
    """PointNet++ SSG part segmentation (ShapeNet part: 50 parts of 16 categories)."""
    return PointNet2Seg(num_classes, PART_SSG, num_categories=num_categories, **kwargs)


SEG_MODELS = {"seg-ssg": SEG_SSG, "part-ssg": PART_SSG, "seg-ssg-lite": SEG_SSG_LITE}


def build_seg_model(name: str, num_classes: int, **kwargs) -> PointNet2Seg:
    """'seg-ssg', 'part-ssg' or 'seg-ssg-lite' -> the model; kwargs go to PointNet2Seg."""
    if name not in SEG_MODELS:
        raise ValueError(f"unknown segmentation model {name!r}; choose one of {sorted(SEG_MODELS)}")
    return PointNet2Seg(num_classes, SEG_MODELS[name], **kwargs)
