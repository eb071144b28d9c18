"""models/: the PointNet++ classifiers, data (procedural set, readers, augmentations, loader) and
the training command (resume, DDP), on the CPU.

Small sizes throughout, one CPU thread: the whole file runs in about a minute on a 2-core CPU
(the torch.compile tests take half of it when the inductor cache is cold).
"""
import csv
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pcops
from models import data as D
from models.pointnet2 import MSG, SSG, PointNet2Classifier, SAConfig, SetAbstraction, build_model
from models.train import epochs_within_budget, lr_at, main as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def unit_sphere_cloud(B, N, gen):
    """B clouds of N points on a unit sphere (so that balls hold neighbours as on real shapes)."""
    x = torch.randn(B, N, 3, generator=gen)
    return x / x.norm(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# model


@pytest.mark.parametrize("name,grouping", [("ssg", "ball"), ("ssg", "knn"), ("ssg-lite", "ball")])
def test_classifier_output_shape(name, grouping, gen):
    model = build_model(name, 7, grouping=grouping)
    xyz = unit_sphere_cloud(2, 600, gen)
    logits = model(xyz)
    assert logits.shape == (2, 7) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_msg_output_shape(gen):
    model = build_model("msg", 40).eval()
    with torch.inference_mode():
        logits = model(unit_sphere_cloud(2, 600, gen))
    assert logits.shape == (2, 40) and torch.isfinite(logits).all()


def test_paper_configuration():
    """The SA configs are the paper's (appendix B.1) and the parameter count is PointNet++'s."""
    assert [(c.npoint, c.radii, c.nsamples) for c in SSG] == [(512, (0.2,), (32,)), (128, (0.4,), (64,)),
                                                            (None, (), ())]
    assert [c.mlps for c in SSG] == [((64, 64, 128),), ((128, 128, 256),), ((256, 512, 1024),)]
    assert MSG[0].radii == (0.1, 0.2, 0.4) and MSG[0].nsamples == (16, 32, 128)
    assert MSG[1].radii == (0.2, 0.4, 0.8) and MSG[1].nsamples == (32, 64, 128)
    ssg, msg = build_model("ssg", 40), build_model("msg", 40)
    assert [sa.out_channels for sa in ssg.sa] == [128, 256, 1024]
    assert [sa.out_channels for sa in msg.sa] == [320, 640, 1024]
    assert sum(p.numel() for p in ssg.parameters()) == 1_472_360
    assert sum(p.numel() for p in msg.parameters()) == 1_742_856
    dropouts = [m.p for m in ssg.head if isinstance(m, torch.nn.Dropout)]
    assert dropouts == [0.5, 0.5]


def test_set_abstraction_shapes(gen):
    xyz = unit_sphere_cloud(3, 100, gen)
    feats = torch.randn(3, 100, 5, generator=gen)
    msg = SetAbstraction(SAConfig(16, (0.3, 0.6), (4, 8), ((8, 6), (10,))), in_channels=5)
    centres, out = msg(xyz, feats)
    assert centres.shape == (3, 16, 3) and out.shape == (3, 16, 16) and msg.out_channels == 16
    fps = pcops.furthest_point_sample(xyz, 16)
    assert torch.equal(centres, torch.stack([xyz[b, fps[b]] for b in range(3)]))
    group_all = SetAbstraction(SAConfig(None, (), (), ((8, 12),)), in_channels=5)
    centres, out = group_all(xyz, feats)
    assert centres.shape == (3, 1, 3) and out.shape == (3, 1, 12)


def reference_set_abstraction(sa, xyz, feats):
    """The SA level written for clarity, one centre at a time in float64: brute-force FPS-chosen
    centres' balls (first nsample points in index order, padded with the first), coordinates
    relative to the centre then features, each layer Linear -> BatchNorm (eval) -> ReLU, max."""
    B = xyz.shape[0]
    centres_idx = pcops.furthest_point_sample(xyz, sa.npoint)
    out = []
    for b in range(B):
        rows = []
        for m in centres_idx[b].tolist():
            c = xyz[b, m].double()
            pooled = []
            for radius, nsample, mlp in zip(sa.radii, sa.nsamples, sa.mlps):
                d2 = ((xyz[b].double() - c) ** 2).sum(-1)
                inside = [i for i in range(xyz.shape[1]) if d2[i] < radius**2][:nsample]
                inside += [inside[0]] * (nsample - len(inside))
                h = torch.cat([xyz[b, inside].double() - c, feats[b, inside].double()], dim=-1)
                layers = list(mlp)
                for lin, bn in zip(layers[0::3], layers[1::3]):
                    h = h @ lin.weight.double().T
                    h = (h - bn.running_mean.double()) / torch.sqrt(bn.running_var.double() + bn.eps)
                    h = torch.relu(h * bn.weight.double() + bn.bias.double())
                pooled.append(h.max(dim=0).values)
            rows.append(torch.cat(pooled))
        out.append(torch.stack(rows))
    return torch.stack(out)


def test_set_abstraction_matches_reference(gen):
    xyz = unit_sphere_cloud(2, 64, gen)
    feats = torch.randn(2, 64, 4, generator=gen)
    sa = SetAbstraction(SAConfig(8, (0.5, 0.9), (4, 6), ((8, 5), (6,))), in_channels=4).eval()
    with torch.no_grad():
        for m in sa.modules():  # non-trivial BatchNorm statistics and affine parameters
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.2, 0.2, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.1, 0.1, generator=gen)
        _, out = sa(xyz, feats)
    ref = reference_set_abstraction(sa, xyz, feats)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grouping", ["ball", "knn"])
def test_gradients_reach_every_parameter(grouping, gen):
    model = build_model("ssg-lite", 5, grouping=grouping)
    xyz = unit_sphere_cloud(4, 200, gen)
    loss = F.cross_entropy(model(xyz), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_gradients_reach_input_features(gen):
    """Gradients flow back through group into the features of the level below."""
    sa = SetAbstraction(SAConfig(8, (0.6,), (6,), ((8,),)), in_channels=3)
    feats = torch.randn(2, 40, 3, generator=gen, requires_grad=True)
    sa(unit_sphere_cloud(2, 40, gen), feats)[1].sum().backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0


def test_one_step_lowers_the_loss(gen):
    model = PointNet2Classifier(4, build_model("ssg-lite", 4).levels, dropout=0.0)
    xyz, labels = unit_sphere_cloud(8, 160, gen) * torch.rand(8, 1, 3, generator=gen), torch.arange(8) % 4
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = F.cross_entropy(model(xyz), labels)
    before.backward()
    opt.step()
    after = F.cross_entropy(model(xyz), labels)
    assert after < before, f"loss went from {before.item():.4f} to {after.item():.4f}"


def test_bf16_autocast_forward(gen):
    model = build_model("ssg-lite", 5)
    xyz = unit_sphere_cloud(4, 160, gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(xyz)
    assert logits.shape == (4, 5) and logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    # in eval mode (no batch statistics over 4 clouds to amplify rounding), float32 agrees
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(xyz).float()
    ref = model(xyz)
    assert (low - ref).norm() < 0.05 * ref.norm(), f"bf16 {low} vs float32 {ref}"


def test_model_argument_errors():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("ssg3", 10)
    with pytest.raises(ValueError, match="grouping"):
        SetAbstraction(SSG[0], 0, grouping="radius")
    with pytest.raises(ValueError, match="group all"):
        PointNet2Classifier(10, SSG[:2])


@pytest.mark.parametrize("grouping", ["ball", pytest.param("knn", marks=pytest.mark.slow)])
def test_torch_compile_matches_eager(grouping, gen):
    model = PointNet2Classifier(5, build_model("ssg-lite", 5).levels, grouping=grouping, dropout=0.0)
    xyz = unit_sphere_cloud(4, 160, gen)
    compiled = torch.compile(model, dynamic=False, fullgraph=True)
    torch.testing.assert_close(compiled(xyz), model(xyz), atol=1e-3, rtol=1e-3)
    compiled(xyz).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_cuda_matches_cpu(cuda, gen):
    """The same weights give the same logits on CUDA (eval mode, full fp32 matmuls)."""
    model = build_model("ssg", 40).eval()
    xyz = D.ProceduralShapes(4, 1024, seed=3).materialize().points
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            ref = model(xyz)
            got = model.to(cuda)(xyz.to(cuda)).cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# the procedural data set


def test_procedural_shapes_deterministic_by_seed():
    a = D.ProceduralShapes(30, 128, seed=3)
    b = D.ProceduralShapes(30, 128, seed=3)
    for i in (29, 0, 17):  # any access order
        assert torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1]
    assert not torch.equal(a[0][0], D.ProceduralShapes(30, 128, seed=4)[0][0])
    assert not torch.equal(a[0][0], D.ProceduralShapes(30, 128, seed=3, split="val")[0][0])
    data = a.materialize()
    assert data.points.shape == (30, 128, 3) and data.labels.tolist() == [i % 10 for i in range(30)]


def test_procedural_shapes_are_surfaces_in_the_unit_ball():
    data = D.ProceduralShapes(40, 512, seed=0, noise=0.0).materialize()
    assert len(D.ProceduralShapes.classes) >= 10 and data.num_classes == len(D.ProceduralShapes.classes)
    radius = data.points.norm(dim=-1).amax(dim=1)
    assert torch.isfinite(data.points).all()
    assert (radius > 0.5).all() and (radius <= 1.0 + 1e-5).all()
    # the plane patch is flat: its smallest principal extent is ~0 (noise off)
    plane = data.points[data.labels == D.ProceduralShapes.classes.index("plane")]
    for p in plane:
        s = torch.linalg.svdvals((p - p.mean(0)).double())
        assert s[-1] < 1e-6 * s[0]
    # a sphere's points all lie at one distance from its centre
    sphere = data.points[data.labels == D.ProceduralShapes.classes.index("sphere")]
    for p in sphere:
        r = (p - 0.5 * (p.amax(0) + p.amin(0))).norm(dim=-1)
        assert r.std() < 0.05 * r.mean()


def test_procedural_split_argument():
    with pytest.raises(ValueError, match="split"):
        D.ProceduralShapes(10, 64, split="dev")
    with pytest.raises(IndexError):
        D.ProceduralShapes(10, 64)[10]


# ---------------------------------------------------------------------------------------------
# readers


def test_read_npz(tmp_path, gen):
    pts = torch.rand(12, 20, 3, generator=gen).numpy().astype(np.float16)
    labels = (np.arange(12) % 3).astype(np.uint8)
    val = np.arange(12) % 4 == 0
    path = tmp_path / "mn.npz"
    np.savez(path, points=pts, labels=labels, classes=np.array(["a", "b", "c"]), val=val,
             shape_ids=np.array([f"s_{i:04d}" for i in range(12)]))
    train, valset = D.read_modelnet40_npz(str(path))
    assert len(train) == 9 and len(valset) == 3 and train.classes == ["a", "b", "c"]
    assert torch.equal(valset.points, torch.from_numpy(pts[val].astype(np.float32)))
    assert valset.labels.tolist() == labels[val].tolist() and train.points.dtype == torch.float32


def test_read_npz_errors(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, points=np.zeros((4, 5, 3), np.float16), labels=np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match=r"bad\.npz: missing key\(s\) \['classes', 'val'\]"):
        D.read_modelnet40_npz(str(bad))
    np.savez(bad, points=np.zeros((4, 5), np.float16), labels=np.zeros(4, np.uint8),
             classes=np.array(["a"]), val=np.zeros(4, bool))
    with pytest.raises(ValueError, match=r"bad\.npz: 'points' must be \[shapes, points, 3\]"):
        D.read_modelnet40_npz(str(bad))
    np.savez(bad, points=np.zeros((4, 5, 3), np.float16), labels=np.full(4, 2, np.uint8),
             classes=np.array(["a"]), val=np.zeros(4, bool))
    with pytest.raises(ValueError, match=r"bad\.npz: label 2 but only 1 classes"):
        D.read_modelnet40_npz(str(bad))
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"junk\.npz: cannot read"):
        D.read_modelnet40_npz(str(tmp_path / "junk.npz"))


def test_read_h5(tmp_path, gen):
    h5py = pytest.importorskip("h5py")
    parts = []
    for k in range(2):  # train1 is listed before train0 on purpose: files are read in numeric order
        pts = torch.rand(5, 16, 3, generator=gen).numpy()
        lab = np.arange(5, dtype=np.uint8)[:, None] + k
        parts.append((pts, lab))
        with h5py.File(tmp_path / f"ply_data_train{k}.h5", "w") as f:
            f["data"], f["label"] = pts, lab
    with h5py.File(tmp_path / "ply_data_test0.h5", "w") as f:
        f["data"], f["label"] = np.zeros((2, 16, 3), np.float32), np.zeros((2, 1), np.uint8)
    (tmp_path / "shape_names.txt").write_text("\n".join(f"c{i}" for i in range(6)) + "\n")
    train = D.read_modelnet40_h5(str(tmp_path), "train")
    assert train.points.shape == (10, 16, 3) and train.classes == [f"c{i}" for i in range(6)]
    assert torch.equal(train.points, torch.from_numpy(np.concatenate([p for p, _ in parts])))
    assert train.labels.tolist() == [0, 1, 2, 3, 4, 1, 2, 3, 4, 5]
    assert len(D.read_modelnet40_h5(str(tmp_path), "test")) == 2
    with h5py.File(tmp_path / "ply_data_train2.h5", "w") as f:
        f["data"] = np.zeros((2, 16, 3), np.float32)
    with pytest.raises(ValueError, match=r"ply_data_train2\.h5: missing dataset\(s\) \['label'\]"):
        D.read_modelnet40_h5(str(tmp_path), "train")
    with pytest.raises(ValueError, match="no ply_data_val"):
        D.read_modelnet40_h5(str(tmp_path), "val")


def write_normal_resampled(root, shapes, gen):
    """A tiny modelnet40_normal_resampled folder; shapes: {class: number of shapes}."""
    classes = sorted(shapes)
    (root / "modelnet40_shape_names.txt").write_text("\n".join(classes) + "\n")
    ids, clouds = [], {}
    for c in classes:
        (root / c).mkdir()
        for i in range(1, shapes[c] + 1):
            sid = f"{c}_{i:04d}"
            rows = torch.rand(12, 6, generator=gen).numpy()
            np.savetxt(root / c / f"{sid}.txt", rows, delimiter=",", fmt="%.6f")
            ids.append(sid)
            clouds[sid] = rows
    (root / "modelnet40_train.txt").write_text("\n".join(ids[1:]) + "\n")
    (root / "modelnet40_test.txt").write_text(ids[0] + "\n")
    return classes, ids, clouds


def test_read_normal_resampled_txt(tmp_path, gen):
    classes, ids, clouds = write_normal_resampled(tmp_path, {"night_stand": 2, "airplane": 2}, gen)
    train = D.read_modelnet40_txt(str(tmp_path), "train", num_points=10)
    assert train.classes == ["airplane", "night_stand"] and len(train) == 3
    assert train.labels.tolist() == [0, 1, 1]
    expected = np.stack([clouds[i][:10, :3] for i in ids[1:]]).astype(np.float32)
    np.testing.assert_allclose(train.points.numpy(), expected, atol=1e-6)
    test = D.read_modelnet40_txt(str(tmp_path), "test", num_points=12)
    assert len(test) == 1 and test.labels.tolist() == [0]


def test_read_normal_resampled_errors(tmp_path, gen):
    write_normal_resampled(tmp_path, {"chair": 2}, gen)
    with pytest.raises(ValueError, match=r"chair_0002\.txt: has 12 points, fewer than the 20"):
        D.read_modelnet40_txt(str(tmp_path), "train", num_points=20)
    (tmp_path / "chair" / "chair_0002.txt").write_text("1,2,3,4,5,6\n1,2,x,4,5,6\n")
    with pytest.raises(ValueError, match=r"chair_0002\.txt: expected rows of comma-separated numbers"):
        D.read_modelnet40_txt(str(tmp_path), "train", num_points=2)
    (tmp_path / "modelnet40_train.txt").write_text("sofa_0001\n")
    with pytest.raises(ValueError, match=r"modelnet40_train\.txt: shape id 'sofa_0001' \(line 1\)"):
        D.read_modelnet40_txt(str(tmp_path), "train", num_points=2)
    with pytest.raises(ValueError, match=r"modelnet40_val\.txt: cannot read"):
        D.read_modelnet40_txt(str(tmp_path), "val")


def test_load_data_dispatch(tmp_path, gen):
    write_normal_resampled(tmp_path, {"chair": 3}, gen)
    train, val = D.load_data(str(tmp_path), num_points=8)
    assert (len(train), len(val)) == (2, 1) and train.points.shape[1] == 8
    train, val = D.load_data("builtin", num_points=32, num_shapes=20, num_val_shapes=10)
    assert (len(train), len(val)) == (20, 10)
    with pytest.raises(ValueError, match="no such file or folder"):
        D.load_data(str(tmp_path / "nothing"))


# ---------------------------------------------------------------------------------------------
# augmentations and the loader


def test_augmentations(gen):
    xyz = unit_sphere_cloud(6, 50, gen)
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    # the factors from the coordinates away from 0 (a coordinate can be exactly 0: no ratio)
    away = xyz.abs() > 1e-3
    scaled = D.random_scale(xyz, 0.8, 1.25, generator=g())
    factor = torch.where(away, scaled / xyz, torch.nan).nanmedian(dim=1, keepdim=True).values
    assert ((factor > 0.8 - 1e-5) & (factor < 1.25 + 1e-5)).all()
    torch.testing.assert_close(scaled, xyz * factor)  # one factor per cloud and axis
    iso = D.random_scale(xyz, 0.8, 1.25, anisotropic=False, generator=g())
    f_iso = torch.where(away, iso / xyz, torch.nan).flatten(1).nanmedian(dim=1).values.view(-1, 1, 1)
    torch.testing.assert_close(iso, xyz * f_iso)  # one factor per cloud
    shift = D.random_shift(xyz, 0.1, generator=g()) - xyz
    assert (shift.abs() <= 0.1 + 1e-6).all() and torch.allclose(shift, shift[:, :1].expand_as(shift), atol=1e-6)
    noise = D.jitter(xyz, 0.01, 0.02, generator=g()) - xyz
    assert (noise.abs() <= 0.02 + 1e-6).all() and noise.std() > 0.005
    rot = D.rotate_up(xyz, up_axis=1, generator=g())
    assert torch.equal(rot[..., 1], xyz[..., 1])
    torch.testing.assert_close(rot[..., [0, 2]].norm(dim=-1), xyz[..., [0, 2]].norm(dim=-1))
    rot_z = D.rotate_up(xyz, up_axis=2, generator=g())
    assert torch.equal(rot_z[..., 2], xyz[..., 2])
    dropped = D.point_dropout(xyz, 0.875, generator=g())
    same = (dropped == xyz).all(-1)
    assert torch.equal(dropped[~same], xyz[:, :1].expand_as(xyz)[~same]) and same[:, 0].all()
    sub = D.random_subset(xyz, 20, generator=g())
    assert sub.shape == (6, 20, 3)
    for b in range(6):  # distinct points of the same cloud
        match = (sub[b, :, None] == xyz[b, None]).all(-1)
        assert (match.sum(1) == 1).all() and match.any(0).sum() == 20
    # the same generator state gives the same batch
    aug = D.Augment(rotate=True, dropout=0.5)
    assert torch.equal(aug(xyz, g()), aug(xyz, g()))


def test_device_loader_train_and_eval():
    data = D.PointClouds(torch.arange(11 * 4 * 3, dtype=torch.float32).view(11, 4, 3), torch.arange(11), "abcdefghijk")
    seen = []
    for rank in (0, 1):
        loader = D.DeviceLoader(data, 2, 3, "cpu", train=True, rank=rank, world_size=2, seed=1,
                                generator=torch.Generator().manual_seed(0))
        loader.set_epoch(3)
        batches = list(loader)
        assert len(loader) == len(batches) == 2  # 5 shapes per process, full batches only
        for xyz, labels, valid in batches:
            assert xyz.shape == (2, 3, 3) and valid.all()
            for x, lab in zip(xyz, labels):  # a subset of the labelled shape's own points
                assert all((p == data.points[lab]).all(-1).any() for p in x)
            seen += labels.tolist()
    assert len(set(seen)) == len(seen) == 8  # the two processes see different shapes
    ev = D.DeviceLoader(data, 4, 4, "cpu", train=False)
    batches = list(ev)
    assert len(batches) == 3 and all(x.shape == (4, 4, 3) for x, _, _ in batches)
    labels = torch.cat([lab for _, lab, _ in batches])
    valid = torch.cat([v for _, _, v in batches])
    assert labels[valid].tolist() == list(range(11)) and valid.sum() == 11
    with pytest.raises(ValueError, match="--points 5"):
        D.DeviceLoader(data, 2, 5, "cpu", train=False)


def test_lr_schedule():
    lrs = [lr_at(s, 100, 10, 1e-3, 0.01) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, 100, 10, 1e-3, 0.01) == pytest.approx(1e-5)
    assert lrs[55] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + math.cos(math.pi * 0.5)))


# ---------------------------------------------------------------------------------------------
# the training command

TINY = ["--num-shapes", "48", "--num-val-shapes", "20", "--points", "160", "--batch-size", "8",
        "--limit-steps", "2", "--no-progress", "--seed", "7"]


def read_metrics(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:  # timing columns differ between runs
        del r["epoch_time_s"], r["elapsed_s"]
    return rows


def test_resume_continues_the_same_curve(tmp_path, monkeypatch):
    flags = TINY + ["--epochs", "2", "--ema", "0.9", "--label-smoothing", "0.1", "--grad-clip", "1.0"]
    train_main(flags + ["--out", str(tmp_path / "straight")])
    straight = read_metrics(tmp_path / "straight" / "metrics.csv")
    assert len(straight) == 2

    # the same run, interrupted during epoch 2 (its evaluation fails), then resumed
    import models.train

    evaluate, calls = models.train.evaluate, []

    def fail_second_time(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return evaluate(*args)

    monkeypatch.setattr(models.train, "evaluate", fail_second_time)
    with pytest.raises(KeyboardInterrupt):
        train_main(flags + ["--out", str(tmp_path / "resumed")])
    monkeypatch.setattr(models.train, "evaluate", evaluate)
    assert len(read_metrics(tmp_path / "resumed" / "metrics.csv")) == 1
    history = train_main(["--resume", str(tmp_path / "resumed" / "last.pt")])
    assert len(history) == 2
    assert read_metrics(tmp_path / "resumed" / "metrics.csv") == straight
    for name in ("train.log", "curves.png", "last.pt", "best.pt"):
        assert (tmp_path / "resumed" / name).exists(), name
    ckpt = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["config"]["seed"] == 7 and set(ckpt) >= {"model", "optimizer", "ema", "best"}


def test_time_budget_plans_then_only_cuts():
    # after epoch 2 (the first epoch compiled: 10 s, the second 2 s), 20 s gone of 100 s:
    # 3 s are reserved and epochs are taken 3% slower, so 77 / 2.06 -> 37 more epochs
    assert epochs_within_budget(100.0, 20.0, [10.0, 2.0], 2, 250) == (39, 2.0)
    # never more than planned, even if the epochs get faster
    assert epochs_within_budget(100.0, 22.0, [10.0, 2.0, 1.0, 1.0, 1.0], 5, 39)[0] == 39
    # the epochs slowed down (median of the last ten, the compiled one left out): fewer epochs
    times = [10.0, 2.0, 2.0, 3.0, 3.0, 3.0]
    fit, per_epoch = epochs_within_budget(100.0, 33.0, times, 6, 39)
    assert per_epoch == 3.0 and fit == 6 + int(64.0 / 3.09) < 39
    # the budget is spent: stop after this epoch, never before it
    assert epochs_within_budget(100.0, 120.0, times, 6, 39)[0] == 6


def test_train_on_npz_file(tmp_path, gen, capsys):
    pts = D.ProceduralShapes(40, 160, seed=1).materialize()
    np.savez(tmp_path / "tiny.npz", points=pts.points.numpy().astype(np.float16),
             labels=pts.labels.numpy().astype(np.uint8),
             classes=np.array(D.ProceduralShapes.classes), val=np.arange(40) % 4 == 0)
    # a time budget that is spent already: the run stops once epoch 2 has timed an epoch
    history = train_main(["--data", str(tmp_path / "tiny.npz"), "--model", "ssg-lite", "--epochs", "5",
                          "--time-budget", "1", "--batch-size", "8", "--no-progress", "--aug-rotate",
                          "--aug-dropout", "0.5", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "30 train / 10 val shapes, 10 classes, 160 points" in out
    assert "time budget 1 s:" in out and "-> 2 epochs in total" in out
    assert "done: 2 epochs" in out and "last-2 average" in out
    assert len(history) == 2 and 0 <= history[-1]["val_acc"] <= 100


def test_compile_failure_falls_back_to_eager(tmp_path, monkeypatch, capsys):
    import models.train

    class Broken(torch.nn.Module):  # what torch.compile returns here: fails on its first call
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, xyz):
            raise RuntimeError("backend compiler failed\nmore lines")

    monkeypatch.setattr(models.train.torch, "compile", lambda model, **kw: Broken(model))
    history = train_main(TINY + ["--epochs", "1", "--compile", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "WARNING: the compiled model failed (RuntimeError: backend compiler failed)" in out
    assert len(history) == 1


@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead"], ids=["eager", "compile", "cudagraphs"])
def test_train_command_on_cuda(cuda, mode, tmp_path, capsys):
    """The GPU path of the training command: data and augmentation on the device, bf16
    autocast, fused AdamW, and torch.compile of the training step, also with CUDA graphs as the
    ModelNet40 preset runs it (which must not fall back)."""
    flags = TINY + ["--device", cuda, "--epochs", "2", "--out", str(tmp_path / "run")]
    history = train_main(flags + (["--compile", "--compile-mode", mode, "--no-compile-eval"] if mode else []))
    out = capsys.readouterr().out
    assert "device cuda, amp bf16" in out and "WARNING" not in out
    assert len(history) == 2 and all(math.isfinite(h["train_loss"]) for h in history)


def test_ddp_two_processes(tmp_path):
    """torchrun --nproc_per_node 2 on the CPU (gloo) against one process on the same global
    batch (16 = 2 x 8): the same shapes, points and augmentations per step (the loader splits the
    global batch), gradients averaged after each step, so the loss curve is one process's within
    tolerance (not bit for bit: BatchNorm normalises each process's 8 rows on their own), and
    the processes end with the same weights. The time budget (spent already) is decided on rank
    0 and broadcast."""
    flags = TINY + ["--epochs", "4", "--time-budget", "1", "--device", "cpu", "--dropout", "0", "--final-votes", "2"]
    one = train_main([f if f != "8" else "16" for f in flags] + ["--out", str(tmp_path / "one")])
    # --device cpu: on a machine with one GPU, two ranks must not share it (NCCL refuses)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "models.train"] + flags + ["--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "x 2 processes" in proc.stdout and "batch 8 per process (16 total)" in proc.stdout
    assert "-> 2 epochs in total" in proc.stdout and "done: 2 epochs" in proc.stdout  # the ranks agreed
    assert "weights identical in the 2 processes: yes" in proc.stdout
    assert "final weights with test-time voting (2 copies per shape)" in proc.stdout
    two = read_metrics(tmp_path / "ddp" / "metrics.csv")
    assert len(two) == len(one) == 2
    # epoch 1 starts from the same weights: only BatchNorm's statistics differ (2.2550 vs 2.2535
    # here); then the weights drift apart by that difference (epoch 2: 1.71 vs 1.84)
    for a, b, rel in zip(one, two, (0.02, 0.15)):
        assert float(a["lr"]) == float(b["lr"])
        assert float(b["train_loss"]) == pytest.approx(a["train_loss"], rel=rel), (one, two)


def test_ddp_cuda_graphs(cuda, tmp_path):
    """Two processes train with the step compiled into CUDA graphs (mode reduce-overhead, as the
    ModelNet40 preset runs under torchrun): no fallback, the same weights in both at the end. The
    processes share one GPU through gloo (NCCL needs one GPU each), so one GPU suffices."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "models.train"] + TINY + ["--epochs", "2", "--device", cuda, "--dist-backend", "gloo", "--compile",
                                           "--compile-mode", "reduce-overhead", "--no-compile-eval",
                                           "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "compile reduce-overhead, training only" in proc.stdout and "WARNING" not in proc.stdout
    assert "weights identical in the 2 processes: yes" in proc.stdout and "done: 2 epochs" in proc.stdout
