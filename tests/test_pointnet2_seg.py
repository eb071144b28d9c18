"""PointNet++ segmentation (models/pointnet2_seg.py): shapes of the configurations, the FP
module against a plain-torch interpolation, and a few training steps on synthetic scenes in
which the loss must fall."""
import pytest
import torch

from helpers import assert_close, rand_points
from models.pointnet2_seg import (PART_SSG, SEG_SSG, SEG_SSG_LITE, FeaturePropagation,
                                  PointNet2Seg, build_seg_model)


def synthetic_scenes(B, N, gen):
    """Points in the unit cube labelled by the quadrant of (x, y): 4 classes, learnable from
    coordinates alone."""
    xyz = torch.rand(B, N, 3, generator=gen)
    labels = (xyz[..., 0] > 0.5).long() + 2 * (xyz[..., 1] > 0.5).long()
    return xyz, labels


def test_fp_module_matches_plain_torch_interpolation(device, gen):
    torch.manual_seed(0)
    fp = FeaturePropagation(8, 2, (16,)).to(device).double().eval()
    dense = rand_points(2, 50, gen, dtype=torch.float64, device=device)
    sparse = rand_points(2, 12, gen, dtype=torch.float64, device=device)
    fd = torch.randn(2, 50, 2, generator=gen, dtype=torch.float64).to(device)
    fs = torch.randn(2, 12, 8, generator=gen, dtype=torch.float64).to(device)
    out = fp(dense, sparse, fd, fs)
    d2 = torch.cdist(dense, sparse).pow(2)
    v, i = d2.topk(3, dim=-1, largest=False)
    w = 1.0 / v.clamp_min(1e-10)
    w = w / w.sum(-1, keepdim=True)
    nb = torch.gather(fs[:, None].expand(-1, 50, -1, -1), 2, i[..., None].expand(-1, -1, -1, 8))
    interp = (nb * w[..., None]).sum(2)
    ref = fp.mlp(torch.cat([interp, fd], -1))
    assert_close(out, ref, atol=1e-10, what="FP output")


@pytest.mark.parametrize("config,N", [(SEG_SSG, 1024), (PART_SSG, 600), (SEG_SSG_LITE, 200)])
def test_shapes(config, N, gen):
    cats = 4 if config is PART_SSG else 0
    model = PointNet2Seg(7, config, in_channels=2, num_categories=cats).eval()
    xyz = torch.rand(2, N, 3, generator=gen)
    feats = torch.rand(2, N, 2, generator=gen)
    category = torch.tensor([0, 3]) if cats else None
    with torch.no_grad():
        out = model(xyz, feats, category)
    assert out.shape == (2, N, 7) and torch.isfinite(out).all()


def test_part_model_needs_the_category(gen):
    model = PointNet2Seg(5, PART_SSG, num_categories=3).eval()
    with pytest.raises(ValueError, match="category"):
        model(torch.rand(1, 300, 3, generator=gen))
    with pytest.raises(ValueError, match="unknown segmentation model"):
        build_seg_model("seg-msg", 3)


def test_training_on_synthetic_scenes_lowers_the_loss(gen):
    torch.manual_seed(0)
    model = build_seg_model("seg-ssg-lite", 4, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xyz, labels = synthetic_scenes(8, 256, gen)
    losses = []
    for _ in range(25):
        logits = model(xyz)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("losses", [round(v, 3) for v in losses])
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    with torch.no_grad():  # batch statistics (25 steps are too few for BatchNorm's running ones)
        acc = (model(xyz).argmax(-1) == labels).float().mean().item()
    assert acc > 0.5, acc


def test_cuda_training_step(cuda, gen):
    model = build_seg_model("seg-ssg", 13).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xyz, labels = synthetic_scenes(2, 2048, gen)
    xyz, labels = xyz.cuda(), labels.cuda()
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(xyz).reshape(-1, 13), (labels % 13).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
