"""pcops.compat.torch_cluster against float64 brute-force references that follow
torch_cluster's documented conventions (the cases of its test_fps / test_knn / test_radius:
batch vectors, ratio, random_start, k larger than a cloud, loop, flow, max_num_neighbors,
empty clouds), and torch_cluster-style client code run after install("torch_cluster")."""
import sys

import pytest
import torch

import pcops
import pcops.compat
from pcops.compat import torch_cluster as tc
from helpers import assert_equal


def clouds(batch, n):
    """(start, stop) of each cloud of a sorted batch vector."""
    B = int(batch.max()) + 1 if len(batch) else 0
    counts = torch.bincount(batch.cpu(), minlength=B)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    return [(int(ptr[b]), int(ptr[b + 1])) for b in range(B)]


def fps_naive(x, batch, ratio, starts=None):
    dtype = x.dtype  # torch_cluster computes ceil(n * ratio) in the dtype of the points
    x = x.detach().cpu().double()
    out = []
    for b, (s, e) in enumerate(clouds(batch, len(x))):
        n = e - s
        k = int(torch.ceil(torch.tensor(float(n), dtype=dtype) * torch.tensor(ratio, dtype=dtype)))
        d = torch.full((n,), float("inf"), dtype=torch.float64)
        cur = 0 if starts is None else starts[b]
        chosen = []
        for _ in range(min(k, n)):
            chosen.append(cur)
            d = torch.minimum(d, ((x[s:e] - x[s + cur]) ** 2).sum(-1))
            d[chosen] = -1
            cur = int(torch.argmax(d))
        out += [s + c for c in chosen]
    return torch.tensor(out, dtype=torch.long)


def knn_naive(x, y, k, batch_x, batch_y):
    x, y = x.detach().cpu().double(), y.detach().cpu().double()
    rows, cols = [], []
    for i in range(len(y)):
        cand = torch.nonzero(batch_x.cpu() == batch_y[i].cpu()).flatten()
        d2 = ((x[cand] - y[i]) ** 2).sum(-1)
        order = sorted(range(len(cand)), key=lambda j: (float(d2[j]), int(cand[j])))[:k]
        rows += [i] * len(order)
        cols += [int(cand[j]) for j in order]
    return torch.tensor([rows, cols], dtype=torch.long).view(2, -1)


def radius_naive(x, y, r, batch_x, batch_y, max_num, ignore_same_index=False):
    x, y = x.detach().cpu().double(), y.detach().cpu().double()
    batch_x, batch_y = batch_x.cpu(), batch_y.cpu()
    rows, cols = [], []
    for i in range(len(y)):
        found = 0
        for j in range(len(x)):
            if found == max_num:
                break
            if batch_x[j] != batch_y[i] or (ignore_same_index and i == j):
                continue
            if float(((x[j] - y[i]) ** 2).sum()) < r * r:
                rows.append(i)
                cols.append(j)
                found += 1
    return torch.tensor([rows, cols], dtype=torch.long).view(2, -1)


def random_batch(sizes, gen, device, D=3):
    batch = torch.cat([torch.full((n,), b, dtype=torch.long) for b, n in enumerate(sizes)])
    x = torch.rand(len(batch), D, generator=gen, dtype=torch.float64)
    return x.to(device), batch.to(device)


# ----------------------------------------------------------------------------------------------
# fps

@pytest.mark.parametrize("sizes", [[50], [30, 0, 17, 1], [100, 64, 3], [40, 40, 40], [33, 33]])
@pytest.mark.parametrize("ratio", [0.5, 0.25, 1.0, 0.3])
def test_fps_matches_naive(device, gen, sizes, ratio):
    x, batch = random_batch(sizes, gen, device)
    idx = tc.fps(x, batch, ratio=ratio, random_start=False)
    assert idx.dtype == torch.long
    assert_equal(idx, fps_naive(x, batch, ratio).to(device), what="fps")


def test_fps_random_start_batch_none_ptr_and_2d(device, gen):
    x, batch = random_batch([40, 25], gen, device)
    idx = tc.fps(x, batch, ratio=0.5)  # random_start=True by default, as there
    first = [int(idx[0]), int(idx[20]) - 40]
    assert 0 <= first[0] < 40 and 0 <= first[1] < 25
    assert_equal(idx, fps_naive(x, batch, 0.5, starts=first).to(device), what="fps random start")
    assert_equal(tc.fps(x[:40], None, 0.5, False), fps_naive(x[:40], batch[:40], 0.5).to(device))
    ptr = torch.tensor([0, 40, 65], device=device)
    assert_equal(tc.fps(x, ptr=ptr, ratio=0.5, random_start=False),
                 tc.fps(x, batch, ratio=0.5, random_start=False))
    x2 = x[:, :2]
    assert_equal(tc.fps(x2, batch, 0.5, False), fps_naive(x2, batch, 0.5).to(device), what="D=2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fps_clouds_of_one_size(device, gen, dtype):
    """Clouds of one size take the path without repacking (the flat points viewed as the
    batch); near misses (a cloud one point short, a trailing empty cloud asked for by
    batch_size, batch_size below the clouds, non-contiguous points) take the general one. All
    agree with the naive FPS."""
    for sizes, batch_size in [([25, 25, 25, 25], None), ([25, 25, 25, 24], None),
                              ([25, 25, 25, 25], 5), ([25, 25, 25, 25], 2), ([1, 1, 1], None)]:
        x, batch = random_batch(sizes, gen, device)
        x = x.to(dtype)
        want = fps_naive(x, batch, 0.3).to(device)
        if batch_size is not None and batch_size < len(sizes):
            want = want[want < sum(sizes[:batch_size])]
        got = tc.fps(x, batch, 0.3, False, batch_size=batch_size)
        assert_equal(got, want, what=f"fps {sizes} batch_size={batch_size}")
    x, batch = random_batch([20, 20], gen, device)
    x_t = x.t().contiguous().t()
    assert not x_t.is_contiguous()
    assert_equal(tc.fps(x_t, batch, 0.5, False), fps_naive(x, batch, 0.5).to(device))


def test_fps_is_exact_far_from_the_origin(device, gen):
    """torch_cluster's CUDA FPS starts distances at 5e4: on a cloud wider than ~224 units it
    returns index order. pcops is exact there."""
    x, batch = random_batch([200], gen, device)
    far = x * 2000.0
    assert_equal(tc.fps(far, batch, 0.1, False), fps_naive(far, batch, 0.1).to(device))
    assert not torch.equal(tc.fps(far, batch, 0.1, False).cpu(), torch.arange(20))


def test_fps_batch_size_ptr_and_empty_clouds(device, gen):
    """batch_size past the last id (trailing empty clouds) and below it (the clouds past it
    are dropped), negative ids, and ptr: the same samples as the reference."""
    x, batch = random_batch([12, 0, 9, 30], gen, device)
    ref = fps_naive(x, batch, 0.4).to(device)
    assert_equal(tc.fps(x, batch, 0.4, False, batch_size=7), ref, what="batch_size 7")
    assert_equal(tc.fps(x, batch, 0.4, False, batch_size=3), ref[ref < 21], what="batch_size 3")
    ptr = torch.tensor([0, 12, 12, 21, 51], device=device)
    assert_equal(tc.fps(x, ptr=ptr, ratio=0.4, random_start=False), ref, what="ptr")
    with pytest.raises(ValueError, match="negative cloud ids"):
        tc.fps(x, batch - 1)


def test_batch_vectors_must_be_sorted(device, gen):
    x, _ = random_batch([10], gen, device)
    bad = torch.tensor([0, 0, 1, 1, 0, 1, 1, 1, 1, 1], device=device)
    with pytest.raises(ValueError, match="'batch' is not sorted"):
        tc.fps(x, bad)
    with pytest.raises(ValueError, match="'batch_x' is not sorted"):
        tc.knn(x, x, 2, bad, torch.zeros(10, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="'batch_y' is not sorted"):
        tc.radius(x, x, 0.5, torch.zeros(10, dtype=torch.long, device=device), bad)


@pytest.mark.parametrize("D", [1, 5, 16])
def test_fps_and_radius_any_dimension(device, gen, D):
    x, bx = random_batch([30, 0, 17, 1], gen, device, D)
    assert_equal(tc.fps(x, bx, 0.5, False), fps_naive(x, bx, 0.5).to(device), what="fps")
    x1, b1 = random_batch([24, 24], gen, device, D)  # clouds of one size: the view path
    assert_equal(tc.fps(x1, b1, 0.5, False), fps_naive(x1, b1, 0.5).to(device), what="fps")
    y, by = random_batch([6, 0, 5, 2], gen, device, D)
    r = 0.35 * D ** 0.5
    out = tc.radius(x, y, r, bx, by, 5)
    assert_equal(out, radius_naive(x, y, r, bx, by, 5).to(device), what="radius")


@pytest.mark.parametrize("D", [2, 5, 16])
@pytest.mark.parametrize("cosine", [False, True])
def test_knn_any_dimension_and_cosine(device, gen, D, cosine):
    x = torch.randn(30, D, generator=gen, dtype=torch.float64).to(device)
    y = torch.randn(12, D, generator=gen, dtype=torch.float64).to(device)
    batch_x = torch.tensor([0] * 20 + [1] * 10, device=device)
    batch_y = torch.tensor([0] * 5 + [1] * 7, device=device)
    row, col = tc.knn(x, y, 4, batch_x, batch_y, cosine=cosine)
    if cosine:
        d = 1 - (y @ x.T) / (y.norm(dim=1)[:, None] * x.norm(dim=1)[None, :])
    else:
        d = ((y[:, None] - x[None]) ** 2).sum(-1)
    d = torch.where(batch_y[:, None] == batch_x[None, :], d, float("inf"))
    expect = d.sort(dim=-1, stable=True).indices[:, :4]
    assert_equal(row, torch.arange(12, device=device).repeat_interleave(4))
    assert_equal(col, expect.reshape(-1))


# ----------------------------------------------------------------------------------------------
# knn, knn_graph

@pytest.mark.parametrize("sizes_x,sizes_y,k", [([20], [7], 3), ([30, 0, 12], [5, 4, 6], 4),
                                              ([3, 50], [10, 10], 5), ([60, 40], [0, 9], 100)])
def test_knn_matches_naive(device, gen, sizes_x, sizes_y, k):
    x, bx = random_batch(sizes_x, gen, device)
    y, by = random_batch(sizes_y, gen, device)
    single = len(sizes_x) == 1
    out = tc.knn(x, y, k, None if single else bx, None if single else by)
    assert_equal(out, knn_naive(x, y, k, bx, by).to(device), what="knn edge_index")


@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_knn_graph(device, gen, loop, flow):
    x, batch = random_batch([25, 1, 30], gen, device)
    out = tc.knn_graph(x, 4, batch, loop=loop, flow=flow)
    ref = knn_naive(x, x, 4 if loop else 5, batch, batch)
    row, col = (ref[1], ref[0]) if flow == "source_to_target" else (ref[0], ref[1])
    if not loop:
        keep = row != col
        row, col = row[keep], col[keep]
    assert_equal(out, torch.stack([row, col]).to(device), what="knn_graph")
    with pytest.raises(ValueError, match="flow"):
        tc.knn_graph(x, 4, batch, flow="both")


# ----------------------------------------------------------------------------------------------
# radius, radius_graph

@pytest.mark.parametrize("sizes_x,sizes_y,r,max_num", [([50], [20], 0.3, 32), ([40, 0, 30], [10, 5, 10], 0.4, 5),
                                                      ([200], [10], 0.5, 3), ([30, 30], [0, 8], 0.2, 64)])
def test_radius_matches_naive(device, gen, sizes_x, sizes_y, r, max_num):
    x, bx = random_batch(sizes_x, gen, device)
    y, by = random_batch(sizes_y, gen, device)
    single = len(sizes_x) == 1
    out = tc.radius(x, y, r, None if single else bx, None if single else by, max_num)
    assert_equal(out, radius_naive(x, y, r, bx, by, max_num).to(device), what="radius")


@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_radius_graph(device, gen, loop, flow):
    x, batch = random_batch([40, 0, 35], gen, device)
    out = tc.radius_graph(x, 0.35, batch, loop=loop, max_num_neighbors=6, flow=flow)
    ref = radius_naive(x, x, 0.35, batch, batch, 6, ignore_same_index=not loop)
    row, col = (ref[1], ref[0]) if flow == "source_to_target" else (ref[0], ref[1])
    assert_equal(out, torch.stack([row, col]).to(device), what="radius_graph")


def test_empty_inputs(device):
    e = torch.empty(0, 3, device=device)
    x = torch.rand(5, 3, device=device)
    assert tc.knn(e, x, 3).shape == (2, 0) and tc.knn(x, e, 3).shape == (2, 0)
    assert tc.radius(e, x, 0.5).shape == (2, 0) and tc.radius_graph(e, 0.5).shape == (2, 0)
    assert tc.fps(e, torch.empty(0, dtype=torch.long, device=device)).shape == (0,)


# ----------------------------------------------------------------------------------------------
# client code

def test_torch_cluster_style_client_code(device, gen):
    """A PyG-style PointNet++ SA step: fps -> radius -> message passing by index_add."""
    pcops.compat.install("torch_cluster")
    try:
        from torch_cluster import fps, knn_graph, radius

        pos, batch = random_batch([300, 200], gen, device)
        pos = pos.float().requires_grad_()
        idx = fps(pos, batch, ratio=0.25)
        row, col = radius(pos, pos[idx], 0.2, batch, batch[idx], max_num_neighbors=16)
        edge_feat = pos[col] - pos[idx][row]
        pooled = torch.zeros(len(idx), 3, device=device).scatter_reduce(
            0, row[:, None].expand(-1, 3), edge_feat.square(), "amax", include_self=False)
        pooled.sum().backward()
        assert torch.isfinite(pos.grad).all()
        assert (batch[col] == batch[idx][row]).all()
        ei = knn_graph(pos.detach(), 6, batch)
        assert ei.shape == (2, 500 * 6) and (ei[0] != ei[1]).all()
    finally:
        pcops.compat.uninstall("torch_cluster")
    assert "torch_cluster" not in sys.modules or not getattr(
        sys.modules["torch_cluster"], "__pcops_compat__", False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fps_sample_counts_round_like_torch_cluster(dtype):
    """torch_cluster computes ceil(n * ratio) in the dtype of the points (ratio as a tensor of
    that dtype); so does the compat fps, for the batched and the single-cloud path."""
    for n in range(0, 600, 7):
        for ratio in (0.1, 0.3, 0.5, 0.7, 1 / 3, 0.9999):
            exp = int(torch.ceil(torch.tensor(float(n), dtype=dtype) * torch.tensor(ratio, dtype=dtype)))
            assert tc._samples(n, ratio, dtype) == exp, (n, ratio)
    x = torch.rand(30, 3, dtype=torch.float64).to(dtype)
    batch = torch.zeros(30, dtype=torch.long)
    exp = int(torch.ceil(torch.tensor(30.0, dtype=dtype) * torch.tensor(0.3, dtype=dtype)))
    assert len(tc.fps(x, None, 0.3, False)) == exp
    assert len(tc.fps(x, batch, 0.3, False, batch_size=2)) == exp  # the batched path


def _syncs(fn, capfd):
    """The number of host synchronisations of fn() in CUDA sync debug mode: the Python warnings
    of syncs in torch calls made from Python (.tolist(), nonzero, ...) plus the lines C++ prints
    for syncs inside ops (pcops's own reads of an output size: torch.ops calls do not turn C++
    warnings into Python warnings, c10's handler prints them to stderr, one line each)."""
    import warnings
    torch.cuda.synchronize()
    capfd.readouterr()  # forget what was printed before
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    printed = capfd.readouterr().err.count("called a synchronizing CUDA operation")
    return sum("synchroniz" in str(w.message) for w in caught) + printed


def test_one_host_synchronisation_per_call(cuda, gen, capfd):
    """fps with a batch vector, radius and knn of one cloud: a single synchronisation (the
    output size depends on the data), as few as torch_cluster's (fps and radius have two);
    knn with every slot filled and PyTorch3D's ball_query: none. Counts per call in the
    message."""
    x, batch = random_batch([300, 200, 1], gen, cuda)
    x = x.float()
    one = x[:300]
    two_clouds = torch.arange(400, device=cuda) // 200
    from pcops.compat import pytorch3d as p3d
    counts = {
        "fps": _syncs(lambda: tc.fps(x, batch, 0.25, False), capfd),
        "fps random_start": _syncs(lambda: tc.fps(x, batch, 0.25, True), capfd),
        "fps clouds of one size": _syncs(lambda: tc.fps(x[:400], two_clouds, 0.25, False), capfd),
        "radius": _syncs(lambda: tc.radius(one, one[:50], 0.2, max_num_neighbors=16), capfd),
        "knn k > N": _syncs(lambda: tc.knn(one, one[:50], 400), capfd),
        "knn": _syncs(lambda: tc.knn(one, one[:50], 8), capfd),
        "pytorch3d ball_query": _syncs(lambda: p3d.ball_query(one[None, :50], one[None], K=8,
                                                              radius=0.2), capfd),
    }
    assert counts == {"fps": 1, "fps random_start": 1, "fps clouds of one size": 1, "radius": 1,
                      "knn k > N": 1, "knn": 0, "pytorch3d ball_query": 0}, counts


def test_fps_batched_dispatches(device, gen):
    """fps with a batch vector dispatches one op before its synchronisation (the layout op,
    whose stats it reads), then the FPS: on clouds of one size just the offsets' add, on
    ragged clouds the repack (its searchsorted, after the synchronisation) and the gather of
    the samples' indices; no reductions of the batch vector outside the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    x, batch = random_batch([64, 64, 64], gen, device)
    x = x.float()
    with Names() as mode:
        tc.fps(x, batch, 0.25, False)
    # on CUDA the stats' .tolist() is a device-to-host copy (_to_copy): the one synchronisation
    read = ["_to_copy"] if x.is_cuda else []
    assert mode.names == ["_fps_layout", *read, "furthest_point_sample", "add_"], mode.names
    x, batch = random_batch([64, 0, 30, 5], gen, device)
    x = x.float()
    with Names() as mode:
        tc.fps(x, batch, 0.25, False)
    assert mode.names[0] == "_fps_layout" and mode.names.count("_fps_layout") == 1
    assert not {"aminmax", "sum", "stack", "ceil"} & set(mode.names), mode.names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fps_batched_sample_counts_per_cloud(device, dtype):
    """The batched path's per-point test rank < ceil(n_b * ratio) (compared in the points'
    dtype where that is exact, through ceil otherwise): per cloud the count torch_cluster
    computes, also for clouds past 2048 points, where half types round n_b and the ranks."""
    sizes = [2501, 3000, 7, 4097, 1, 2049]
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(device)
    x = torch.rand(sum(sizes), 3, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    for ratio in (0.3, 1 / 3, 0.5, 0.9999):
        out = tc.fps(x, batch, ratio, False)
        got = torch.bincount(batch[out].cpu(), minlength=len(sizes)).tolist()
        # (a product rounded past n, as bfloat16's 3000 * 0.9999 -> 3008, samples the cloud)
        exp = [min(n, int(torch.ceil(torch.tensor(float(n), dtype=dtype)
                                     * torch.tensor(ratio, dtype=dtype)))) for n in sizes]
        assert got == exp, (ratio, got, exp)
