"""models/dgcnn.py: the DGCNN classifier on pcops.knn and pcops.group (CPU; CUDA where present).

The EdgeConv's graph against a float64 brute-force kNN, its output against an EdgeConv written
with plain torch gathers, gradients (gradcheck), the torch kNN backend against the pcops one, a
few training steps, and `python -m models.train --model dgcnn` end to end. Small sizes, one CPU
thread: seconds.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from models.checkpoint import load_model
from models.classifiers import build_classifier
from models.data import ProceduralShapes
from models.dgcnn import DGCNN, EdgeConv, knn_graph
from models.train import main as train_main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def reference_knn(x, k):
    """float64 brute force: squared distances as a sum of squared differences, sorted by
    (distance, index) -> (idx [B,N,k], the sorted distances [B,N,k+1])."""
    x = x.double()
    d2 = ((x.unsqueeze(2) - x.unsqueeze(1)) ** 2).sum(-1)                     # [B,N,N]
    d2s, order = torch.sort(d2, dim=-1, stable=True)
    return order[..., :k], d2s[..., :k + 1]


def reference_edgeconv(conv, x, idx):
    """The EdgeConv of the paper with torch.gather instead of pcops.group, same weights."""
    B, N, C = x.shape
    k = idx.shape[-1]
    neighbours = torch.gather(x.unsqueeze(1).expand(B, N, N, C), 2, idx.unsqueeze(-1).expand(B, N, k, C))
    centre = x.unsqueeze(2).expand(B, N, k, C)
    edges = torch.cat([neighbours - centre, centre], -1).reshape(B * N * k, 2 * C)
    h = F.leaky_relu(conv.bn(F.linear(edges, conv.linear.weight)), 0.2)
    return h.view(B, N, k, -1).amax(2)


def tie_free(x, k, rel=1e-6):
    """Whether the first k+1 sorted distances of every point differ by more than rel: the kNN
    graph is then unique (no exact or near ties, not even between slot k and k+1)."""
    _, d2s = reference_knn(x, k)
    gaps = d2s[..., 1:] - d2s[..., :-1]
    return bool((gaps > rel * d2s[..., -1:].clamp_min(1e-30)).all())


def features(gen, B, N, C, k, dtype=torch.float32):
    for _ in range(20):  # continuous random features: ties are improbable, but check
        x = torch.randn(B, N, C, generator=gen, dtype=dtype)
        if tie_free(x, k):
            return x
    raise AssertionError("no tie-free sample drawn")


@pytest.mark.parametrize("C", [3, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_knn_graph_matches_float64_reference(C, dtype, gen):
    x = features(gen, 2, 90, C, 20, dtype)
    ref, _ = reference_knn(x, 20)
    assert torch.equal(knn_graph(x, 20, "pcops"), ref)
    # the plain-torch graph is the same where the distances are well separated (these inputs)
    assert torch.equal(knn_graph(x, 20, "torch"), ref)


@pytest.mark.parametrize("C", [3, 64])
def test_edgeconv_matches_reference(C, gen):
    conv = EdgeConv(C, 32, k=10)
    with torch.no_grad():
        conv.bn.weight.uniform_(0.5, 1.5, generator=gen)
        conv.bn.bias.uniform_(-0.5, 0.5, generator=gen)
    x = features(gen, 2, 60, C, 10)
    ref_idx, _ = reference_knn(x, 10)
    out = conv(x)
    assert out.shape == (2, 60, 32)
    # the graph pcops builds is the reference graph: the same output bit for bit
    assert torch.equal(out, conv(x, ref_idx))
    # and the layer is the paper's EdgeConv (torch gathers; rounding of a different gather
    # / sum order only)
    torch.testing.assert_close(out, reference_edgeconv(conv, x, ref_idx), rtol=1e-5, atol=1e-5)
    conv.knn_backend = "torch"
    assert torch.equal(conv(x), out)


def test_edgeconv_gradcheck(gen):
    conv = EdgeConv(3, 5, k=4).double()
    x = features(gen, 1, 12, 3, 4, torch.float64).requires_grad_()
    # the graph is piecewise constant in x: gradcheck's perturbations (1e-6) stay in one piece
    # on tie-free inputs, so the derivative is that of the gathered features
    assert torch.autograd.gradcheck(lambda x: conv(x), (x,), eps=1e-6, atol=1e-5)
    # and the weights get gradients
    conv(x).sum().backward()
    assert conv.linear.weight.grad is not None and conv.linear.weight.grad.abs().sum() > 0


def test_model_shapes_backends_and_errors(gen):
    model = build_classifier("dgcnn", 7, k=8).eval()
    assert isinstance(model, DGCNN) and model.knn_backend == "pcops"
    assert 1.7e6 < sum(p.numel() for p in model.parameters()) < 1.9e6  # the paper: 1.8 M
    xyz = ProceduralShapes(3, 128, seed=1).materialize().points
    with torch.no_grad():
        logits = model(xyz)
        model.knn_backend = "torch"
        assert all(conv.knn_backend == "torch" for conv in model.convs)
        logits_torch = model(xyz)
    assert logits.shape == (3, 7)
    # surfaces and features: distances well apart, the same graph in every layer
    torch.testing.assert_close(logits_torch, logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="knn_backend"):
        model.knn_backend = "faiss"
    with pytest.raises(ValueError, match="at least 8 points"):
        model(xyz[:, :5])
    with pytest.raises(ValueError, match="unknown model"):
        build_classifier("dgcnn2", 7)


def test_a_few_steps_lower_the_loss(gen):
    torch.manual_seed(0)
    model = DGCNN(4, k=8, dropout=0.0)
    shapes = ProceduralShapes(16, 96, seed=2).materialize()
    xyz, labels = shapes.points, shapes.labels % 4
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(xyz), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.7 * losses[0], losses


def test_train_command_dgcnn(tmp_path, capsys):
    out = tmp_path / "run"
    history = train_main(["--model", "dgcnn", "--k", "8", "--num-shapes", "32", "--num-val-shapes", "16",
                          "--points", "64", "--batch-size", "8", "--limit-steps", "2", "--epochs", "1",
                          "--final-votes", "2", "--optimizer", "sgd", "--lr", "0.1", "--no-nesterov",
                          "--no-progress", "--seed", "3", "--out", str(out)])
    log = capsys.readouterr().out
    assert "pcops DGCNN (k=8, pcops kNN, 1.80 M parameters)" in log and "sgd lr 0.1" in log
    assert len(history) == 1 and math.isfinite(history[0]["train_loss"])
    for name in ("train.log", "metrics.csv", "curves.png", "last.pt", "best.pt"):
        assert (out / name).exists(), name
    model, spec = load_model(str(out / "best.pt"))
    assert isinstance(model, DGCNN) and spec["k"] == 8 and spec["knn_backend"] == "pcops"


def test_presets():
    from models.train import parse_args

    args, _ = parse_args(["--preset", "modelnet40-dgcnn"])
    assert (args.model, args.epochs, args.optimizer, args.lr, args.momentum, args.nesterov) == \
        ("dgcnn", 250, "sgd", 0.1, 0.9, False)
    assert args.min_lr_ratio * args.lr == pytest.approx(0.001) and args.time_budget == 0
    short, _ = parse_args(["--preset", "modelnet40-dgcnn-8min", "--knn-backend", "torch"])
    assert short.epochs == 250 and short.time_budget == 450 and short.knn_backend == "torch"
