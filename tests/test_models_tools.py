"""models.evaluate, models.predict, --val-split none and the pieces of multi-process training
(the global-batch loader split, the gradient average) on the CPU.

One tiny checkpoint is trained per module (a few steps of ssg-lite on the built-in shapes).
"""
import csv
import json
import os

import numpy as np
import pytest
import torch

import pcops
from models import data as D
from models import evaluate as E
from models import predict as P
from models import train as T
from models.checkpoint import load_checkpoint, load_model

TINY = ["--num-shapes", "48", "--num-val-shapes", "20", "--points", "160", "--batch-size", "8",
        "--limit-steps", "2", "--no-progress", "--seed", "7"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(run folder, history) of 2 epochs x 2 steps, EMA on, final voting with 3 copies."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    history = T.main(TINY + ["--epochs", "2", "--ema", "0.9", "--final-votes", "3", "--out", str(out)])
    return out, history


# ---------------------------------------------------------------------------------------------
# evaluate


class ByMeanX(torch.nn.Module):
    """A stand-in classifier whose logits depend on the cloud (its mean x coordinate) and not
    on the order of its points: class floor((mean x + 1) * K / 2)."""

    def __init__(self, K):
        super().__init__()
        self.K = K

    def forward(self, xyz):
        k = ((xyz[..., 0].mean(1) + 1) * self.K / 2).floor().long().clamp(0, self.K - 1)
        return torch.nn.functional.one_hot(k, self.K).float()


def test_confusion_matrix_counts_and_votes(gen):
    K, S, N = 4, 11, 9
    pts = torch.rand(S, N, 3, generator=gen) * 2 - 1
    labels = torch.randint(0, K, (S,), generator=gen)
    data = D.PointClouds(pts, labels, "abcd")
    loader = D.DeviceLoader(data, 4, N, "cpu", train=False)   # 3 batches, the last padded
    model = ByMeanX(K)
    conf = E.confusion_matrix(model, loader, K)
    pred = model(pts).argmax(1)
    ref = torch.zeros(K, K, dtype=torch.long)
    for t, p in zip(labels.tolist(), pred.tolist()):
        ref[t, p] += 1
    assert torch.equal(conf, ref) and conf.sum() == S
    oa, macc, per_class = E.accuracies(conf)
    assert oa == pytest.approx(100.0 * (pred == labels).double().mean().item())
    present = [k for k in range(K) if (labels == k).any()]
    expect = [100.0 * ((pred == labels) & (labels == k)).sum().item() / (labels == k).sum().item() for k in present]
    assert macc == pytest.approx(sum(expect) / len(expect))
    assert torch.allclose(per_class[present], torch.tensor(expect, dtype=torch.float64))
    # votes without augmentation: copies 1.. are the same points in another order -> same logits
    g = torch.Generator().manual_seed(1)
    assert torch.equal(E.confusion_matrix(model, loader, K, votes=3, generator=g), conf)
    # a shift that moves every copy past x = 1: the averaged logits of 1 + 4 copies pick the top class
    shift = lambda xyz, generator=None: xyz + 5.0  # noqa: E731
    voted = E.confusion_matrix(model, loader, K, votes=5, augment=shift, generator=g)
    assert torch.equal(voted.sum(0)[:K - 1], torch.zeros(K - 1, dtype=torch.long)) and voted.sum() == S


def test_evaluate_command_matches_training(tiny_run, tmp_path, capsys):
    out, history = tiny_run
    text = (out / "train.log").read_text()
    assert "final weights with test-time voting (3 copies per shape)" in text
    # the final checkpoint (EMA weights are what best.pt holds; last.pt holds the raw weights,
    # evaluated with the EMA swapped in during training): best.pt of the last best epoch
    best = load_checkpoint(str(out / "best.pt"))
    res = E.main([str(out / "best.pt"), "--votes", "1", "--out", str(tmp_path)])
    assert res["overall_acc"] == pytest.approx(best["val_acc"])
    assert res["split"] == "val" and res["shapes"] == 20 and sum(map(sum, res["confusion"])) == 20
    assert (tmp_path / "confusion-val.png").stat().st_size > 1000
    assert json.loads((tmp_path / "eval-val.json").read_text())["overall_acc"] == res["overall_acc"]
    voted = E.main([str(out / "best.pt"), "--votes", "3", "--seed", "1", "--out", str(tmp_path), "--no-plot"])
    again = E.main([str(out / "best.pt"), "--votes", "3", "--seed", "1", "--out", str(tmp_path), "--no-plot"])
    assert voted["confusion"] == again["confusion"] and sum(map(sum, voted["confusion"])) == 20
    printed = capsys.readouterr().out
    assert "overall accuracy" in printed and "mean class accuracy" in printed and "3 vote(s)" in printed


def test_evaluate_on_a_npz_and_bad_input(tiny_run, tmp_path):
    out, _ = tiny_run
    shapes = D.ProceduralShapes(12, 200, seed=3).materialize()
    np.savez(tmp_path / "mn.npz", points=shapes.points.numpy().astype(np.float16),
             labels=shapes.labels.numpy().astype(np.uint8), classes=np.array(D.ProceduralShapes.classes),
             val=np.arange(12) % 3 == 0)
    res = E.main([str(out / "last.pt"), "--data", str(tmp_path / "mn.npz"), "--out", str(tmp_path), "--no-plot"])
    assert res["split"] == "val" and res["shapes"] == 4 and res["points"] == 160
    res = E.main([str(out / "last.pt"), "--data", str(tmp_path / "mn.npz"), "--split", "all", "--no-plot",
                  "--out", str(tmp_path)])
    assert res["shapes"] == 12
    with pytest.raises(SystemExit, match="npz has the splits"):
        E.main([str(out / "last.pt"), "--data", str(tmp_path / "mn.npz"), "--split", "test"])
    (tmp_path / "junk.pt").write_text("no checkpoint")
    with pytest.raises(SystemExit, match=r"junk\.pt: cannot read as a torch checkpoint"):
        E.main([str(tmp_path / "junk.pt")])


# ---------------------------------------------------------------------------------------------
# --val-split none


def test_val_split_none_trains_on_every_shape(tmp_path, capsys):
    shapes = D.ProceduralShapes(40, 160, seed=1).materialize()
    np.savez(tmp_path / "tiny.npz", points=shapes.points.numpy().astype(np.float16),
             labels=shapes.labels.numpy().astype(np.uint8), classes=np.array(D.ProceduralShapes.classes),
             val=np.arange(40) % 4 == 0)
    train, val = D.load_data(str(tmp_path / "tiny.npz"), val_split="none")
    assert val is None and len(train) == 40
    assert sorted(train.points.sum((1, 2)).tolist()) == sorted(shapes.points.half().float().sum((1, 2)).tolist())
    history = T.main(["--data", str(tmp_path / "tiny.npz"), "--model", "ssg-lite", "--epochs", "2", "--batch-size", "8",
                      "--val-split", "none", "--no-progress", "--out", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert "40 train / no val (--val-split none) shapes" in printed and "5 steps/epoch" in printed
    assert "(no validation)" in printed and "voting" not in printed
    assert len(history) == 2 and all(h["val_acc"] is None for h in history)
    assert (tmp_path / "run" / "last.pt").exists() and not (tmp_path / "run" / "best.pt").exists()
    with open(tmp_path / "run" / "metrics.csv") as f:
        assert [r["val_acc"] for r in csv.DictReader(f)] == ["", ""]


# ---------------------------------------------------------------------------------------------
# predict


def write_clouds(folder, gen):
    """Four clouds of 300 points (shapes of the built-in set, moved and scaled: predict
    normalises them) as .npy, and one broken file."""
    shapes = D.ProceduralShapes(4, 300, seed=11).materialize()
    paths = []
    for i, p in enumerate(shapes.points):
        path = folder / f"cloud{i}.npy"
        np.save(path, (p * 3.0 + torch.tensor([5.0, -2.0, 1.0])).numpy())
        paths.append(str(path))
    (folder / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    return paths


def test_predict_files_and_a_cache(tiny_run, tmp_path, gen, capsys):
    out, _ = tiny_run
    clouds = tmp_path / "clouds"
    clouds.mkdir()
    paths = write_clouds(clouds, gen)
    code = P.main([str(out / "last.pt"), str(clouds), "--csv", str(tmp_path / "p.csv"), "--top", "2"])
    assert code == 1  # the broken file, reported; the others are classified
    err = capsys.readouterr().err
    assert "1 input(s) failed" in err and "broken.npy" in err
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["input"] for r in rows] == paths
    # reference: the model on the clouds normalised in float64 and sampled by FPS from point 0
    model, spec = load_model(str(out / "last.pt"))
    ref = []
    for path in paths:
        x = torch.from_numpy(np.load(path)).double()
        x = x - x.mean(0)
        x = (x / x.norm(dim=1).max()).float()
        idx = pcops.furthest_point_sample(x[None], spec["points"])[0]
        with torch.no_grad():
            ref.append(model(x[idx][None]).softmax(1)[0])
    ref = torch.stack(ref)
    got = torch.tensor([float(r["probability"]) for r in rows])
    assert [r["class"] for r in rows] == [spec["classes"][i] for i in ref.argmax(1).tolist()]
    torch.testing.assert_close(got, ref.max(1).values, atol=2e-4, rtol=0)
    assert all(float(r["probability"]) >= float(r["probability_2"]) for r in rows)

    # the same clouds through a preprocess cache (normalised, FPS centres = the model's points)
    from pcops.preprocess._command import main as preprocess_main

    cache = tmp_path / "cache.npz"
    assert preprocess_main(paths + ["-o", str(cache), "--npoint", str(spec["points"]), "--nsample", "4",
                                    "--normalize", "--device", "cpu", "--no-progress"]) == 0
    assert P.main([str(out / "last.pt"), str(cache), "--csv", str(tmp_path / "c.csv")]) == 0
    with open(tmp_path / "c.csv") as f:
        cached = list(csv.DictReader(f))
    assert [r["input"].split(":", 1)[1] for r in cached] == [os.path.abspath(p) for p in paths]
    assert [r["class"] for r in cached] == [r["class"] for r in rows]
    torch.testing.assert_close(torch.tensor([float(r["probability"]) for r in cached]), got, atol=2e-3, rtol=0)


def test_prepare_cloud_small_and_bad():
    x = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [float("nan"), 0.0, 0.0]])
    out = P.prepare_cloud(x, 5)
    assert out.shape == (5, 3) and torch.isfinite(out).all()
    assert out.norm(dim=1).max() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no finite points"):
        P.prepare_cloud(torch.full((3, 3), float("inf")), 5)


# ---------------------------------------------------------------------------------------------
# several processes: the data split and the gradient average


def test_loader_split_is_the_global_batch(gen):
    """Two processes' rows of each step, interleaved, are the batch of one process with twice
    the batch size: the same shapes, points and augmentation, bit for bit."""
    pts = torch.rand(26, 12, 3, generator=gen)
    data = D.PointClouds(pts, torch.arange(26) % 5, "abcde")
    aug = D.Augment(rotate=True, dropout=0.3)

    def batches(batch, rank, world):
        g = torch.Generator().manual_seed(123)
        loader = D.DeviceLoader(data, batch, 10, "cpu", train=True, augment=aug, generator=g, rank=rank,
                                world_size=world, seed=4)
        loader.set_epoch(2)
        return list(loader)

    one = batches(8, 0, 1)
    parts = [batches(4, r, 2) for r in range(2)]
    assert len(one) == len(parts[0]) == len(parts[1]) == 3
    for k, (xyz, labels, _) in enumerate(one):
        x2 = torch.stack([parts[0][k][0], parts[1][k][0]], 1).flatten(0, 1)   # rows 0, 1, 2, ... interleaved
        l2 = torch.stack([parts[0][k][1], parts[1][k][1]], 1).flatten()
        assert torch.equal(x2, xyz) and torch.equal(l2, labels)


def test_average_gradients_divides_and_maps_back(monkeypatch, gen):
    """One flat all-reduce whose slices become the .grad of each parameter, divided by the
    number of processes (here a stand-in all-reduce: four processes with the same gradients)."""
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(3, 4), (5,), (2, 2, 2)]]
    grads = [torch.randn(p.shape, generator=gen) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    params[1].grad = None  # no gradient counts as zero
    calls = []
    monkeypatch.setattr(T.dist, "all_reduce", lambda t: (calls.append(t.numel()), t.mul_(4)))
    T.average_gradients(params, 4)
    assert calls == [12 + 5 + 8]
    assert torch.equal(params[0].grad, grads[0]) and torch.equal(params[2].grad, grads[2])
    assert torch.equal(params[1].grad, torch.zeros(5))


def test_batch_and_lr_scaling():
    args = T.parse_args(["--preset", "modelnet40-h100"])[0]
    assert T.batch_and_lr(args, 1)[:2] == (32, 1e-3)  # one GPU: the preset as measured
    batch, lr, desc = T.batch_and_lr(args, 2)
    assert batch == 32 and lr == pytest.approx(1e-3 * 2 ** 0.5) and "sqrt of 64/32" in desc
    args = T.parse_args(["--preset", "modelnet40-h100", "--global-batch-size", "32"])[0]
    assert T.batch_and_lr(args, 2)[:2] == (16, 1e-3)
    args = T.parse_args(["--batch-size", "8", "--lr-scaling", "linear", "--lr", "0.01"])[0]
    assert T.batch_and_lr(args, 4)[:2] == (8, pytest.approx(0.04))
    with pytest.raises(SystemExit, match="does not split"):
        T.batch_and_lr(T.parse_args(["--global-batch-size", "10"])[0], 4)
