"""pcops.preprocess: the API against NumPy references (kNN and ball query neighbours, grouped
coordinates and features, lengths, normalisation), ragged batches against single clouds bit for
bit, the stream iterator, the CUDA graph against eager (cuda), CPU against CUDA (cuda), and the
command (a folder with a broken file, re-runs, settings, the torchrun split over 2 processes)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import pcops
from pcops import io as pio

from conftest import HAS_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_clouds(rng, sizes, *, scale=5.0, offset=100.0):
    return [(rng.standard_normal((n, 3)) * scale + offset).astype(np.float32) for n in sizes]


# ---------------------------------------------------------------------------------------------
# references (NumPy, written for clarity)

def d2_f32(a, b):
    """Squared distances in float32, summed x, y, z left to right with no FMA (the op contract)."""
    d = (a[:, None, :] - b[None, :, :]).astype(np.float32)
    return (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]


def knn_ref(centres, pts, k):
    d = d2_f32(centres, pts)
    order = np.lexsort((np.broadcast_to(np.arange(pts.shape[0]), d.shape), d), axis=-1)[:, :k]
    out = np.full((centres.shape[0], k), -1, np.int64)
    out[:, : order.shape[1]] = order
    return out


def ball_ref(centres, pts, radius, nsample):
    r2 = np.float32(np.float64(radius) ** 2)
    inside = d2_f32(centres, pts) < r2
    out = np.full((centres.shape[0], nsample), -1, np.int64)
    for m in range(centres.shape[0]):
        found = np.flatnonzero(inside[m])[:nsample]
        if len(found):
            out[m] = found[0]
            out[m, : len(found)] = found
    return out


def check_one(out, b, pts, npoint, nsample, *, radius=None, feats=None, normalize=False):
    """Cloud b of a result against the references. pts: the raw [N,3] float32 cloud."""
    N = pts.shape[0]
    L = min(npoint, N)
    assert int(out.lengths[b]) == L and int(out.point_lengths[b]) == N
    if normalize:
        mean = pts.astype(np.float64).mean(0)
        np.testing.assert_allclose(out.shift[b].numpy(), mean, rtol=1e-6, atol=1e-4)
        shift = out.shift[b].numpy()
        centred = pts - shift
        r = np.sqrt((centred.astype(np.float64) ** 2).sum(1)).max() if N else 0.0
        np.testing.assert_allclose(float(out.scale[b]), r if r > 0 else 1.0, rtol=1e-6)
        pts = centred / out.scale[b].numpy()
        assert N == 0 or abs(np.sqrt((pts.astype(np.float64) ** 2).sum(1)).max() - 1) < 1e-5
    else:
        assert (out.shift[b] == 0).all() and (out.scale[b] == 1).all()
    s = out.sample_idx[b].numpy()
    assert s[0] == (0 if N else -1) and (s[L:] == -1).all()
    assert len(set(s[:L].tolist())) == L and ((0 <= s[:L]) & (s[:L] < N)).all()
    centres = out.centres[b].numpy()
    np.testing.assert_array_equal(centres[:L], pts[s[:L]])
    assert (centres[L:] == 0).all()
    idx = out.idx[b].numpy()
    want = knn_ref(centres[:L], pts, nsample) if radius is None else ball_ref(centres[:L], pts, radius, nsample)
    np.testing.assert_array_equal(idx[:L], want)
    assert (idx[L:] == -1).all()
    if out.grouped is not None:
        g = out.grouped[b].numpy()
        C = 0 if feats is None else feats.shape[1]
        assert g.shape == (npoint, nsample, 3 + C)
        rel = np.where(idx[..., None] >= 0, pts[idx] - centres[:, None, :], 0)
        np.testing.assert_array_equal(g[..., :3], rel)
        if feats is not None:
            np.testing.assert_array_equal(g[..., 3:], np.where(idx[..., None] >= 0, feats[idx], 0))


# ---------------------------------------------------------------------------------------------
# the API

@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("radius", [None, 0.7])
def test_ragged_list_against_references(seed, normalize, radius):
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 300)), 5, int(rng.integers(100, 400)), 64]
    clouds = make_clouds(rng, sizes, scale=1.0 if not normalize and radius else 5.0,
                         offset=0.0 if not normalize and radius else 100.0)
    feats = [rng.standard_normal((n, 2)).astype(np.float32) for n in sizes]
    npoint, nsample = 64, int(rng.integers(1, 20))
    out = pcops.preprocess(clouds, npoint, nsample, radius=radius, features=feats, normalize=normalize)
    B, Nmax = len(sizes), max(sizes)
    assert out.centres.shape == (B, npoint, 3) and out.idx.shape == (B, npoint, nsample)
    assert out.grouped.shape == (B, npoint, nsample, 5) and out.idx.dtype == torch.long
    assert out.sample_idx.shape == (B, npoint) and out.shift.shape == (B, 3) and out.scale.shape == (B,)
    assert not out.grouped.requires_grad and out.centres.is_inference()
    for b in range(B):
        check_one(out, b, clouds[b], npoint, nsample, radius=radius, feats=feats[b], normalize=normalize)
    assert int(out.idx.max()) < Nmax


def test_one_cloud_equals_its_row_in_a_ragged_batch(seed):
    rng = np.random.default_rng(seed)
    clouds = make_clouds(rng, [200, 37, 512])
    batch = pcops.preprocess(clouds, 48, 8, normalize=True)
    for b, c in enumerate(clouds):
        alone = pcops.preprocess(torch.from_numpy(c), 48, 8, normalize=True)
        for name, x, y in zip(batch._fields, batch, alone):
            assert torch.equal(x[b], y[0]), name
    # a padded tensor with more padding than needed gives the same bits
    pad = torch.zeros(3, 700, 3)
    for b, c in enumerate(clouds):
        pad[b, : len(c)] = torch.from_numpy(c)
        pad[b, len(c):] = 1e6  # padding values are never read
    again = pcops.preprocess(pad, 48, 8, lengths=torch.tensor([200, 37, 512]), normalize=True)
    for name, x, y in zip(batch._fields, batch, again):
        assert torch.equal(x, y), name


def test_knn_with_fewer_points_than_nsample_and_npoint():
    xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 2, 0]])
    out = pcops.preprocess(xyz, 5, 4)
    assert out.lengths.tolist() == [3]
    assert out.sample_idx[0].tolist() == [0, 2, 1, -1, -1]
    assert out.idx[0, 0].tolist() == [0, 1, 2, -1] and (out.idx[0, 3:] == -1).all()
    assert (out.grouped[0, :, 3] == 0).all() and (out.grouped[0, 3:] == 0).all()
    assert out.grouped[0, 1, 1].tolist() == [0.0, -2.0, 0.0]  # centre (0,2,0), neighbour 0


def test_empty_cloud_in_a_batch(seed):
    rng = np.random.default_rng(seed)
    clouds = make_clouds(rng, [0, 10])
    out = pcops.preprocess(clouds, 4, 3, normalize=True)
    assert out.lengths.tolist() == [0, 4]
    assert (out.idx[0] == -1).all() and (out.centres[0] == 0).all() and (out.grouped[0] == 0).all()
    assert torch.isfinite(out.grouped).all() and out.scale[0] == 1
    check_one(out, 1, clouds[1], 4, 3, normalize=True)


def test_dtypes_inputs_and_options(seed):
    rng = np.random.default_rng(seed)
    c = make_clouds(rng, [100])[0]
    out64 = pcops.preprocess(c.astype(np.float64), 16, 4)
    assert out64.centres.dtype == torch.float64 and out64.grouped.dtype == torch.float64
    out16 = pcops.preprocess(torch.from_numpy(c).half(), 16, 4)
    assert out16.centres.dtype == torch.float32
    cloud = pio.Cloud(path="x", xyz=c)
    a = pcops.preprocess([cloud], 16, 4, grouped=False)
    b = pcops.preprocess(c, 16, 4)
    assert a.grouped is None and torch.equal(a.idx, b.idx)
    from pcops import preprocess as mod  # the module is the function too
    assert torch.equal(mod(c, 16, 4).idx, b.idx) and torch.equal(mod.preprocess(c, 16, 4).idx, b.idx)


@pytest.mark.parametrize("kwargs,match", [
    (dict(npoint=0), "npoint"), (dict(nsample=0), "nsample"), (dict(radius=-1.0), "radius"),
    (dict(radius=float("nan")), "radius"), (dict(clouds=np.zeros((5, 2), np.float32)), r"\[N, 3\]"),
    (dict(clouds=[]), "empty"), (dict(features=[np.zeros((3, 2), np.float32)]), "features 0"),
    (dict(clouds=np.zeros((2, 5, 4), np.float32)), "clouds must be"),
    (dict(clouds=[np.zeros((5, 3), np.int32)]), "floating point"),
    (dict(lengths=torch.tensor([5])), "lengths"),
])
def test_errors(kwargs, match):
    args = dict(clouds=[np.zeros((5, 3), np.float32)], npoint=2, nsample=2)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        pcops.preprocess(args.pop("clouds"), args.pop("npoint"), args.pop("nsample"), **args)


def test_stream_on_cpu_equals_batches(seed):
    rng = np.random.default_rng(seed)
    clouds = make_clouds(rng, rng.integers(1, 200, 7).tolist())
    outs = list(pcops.preprocess_stream(iter(clouds), 32, 6, batch_size=3, device="cpu", normalize=True))
    assert [o.lengths.shape[0] for o in outs] == [3, 3, 1]
    for i, o in enumerate(outs):
        ref = pcops.preprocess(clouds[3 * i: 3 * i + 3], 32, 6, normalize=True)
        for name, x, y in zip(ref._fields, ref, o):
            assert torch.equal(x, y), (i, name)


def test_stream_checks_arguments_at_the_call_and_leaves_grad_mode_alone():
    with pytest.raises(ValueError, match="batch_size"):
        pcops.preprocess_stream([], 4, 4, batch_size=0, device="cpu")
    clouds = [np.random.default_rng(0).random((20, 3), dtype=np.float32)] * 2
    for out in pcops.preprocess_stream(clouds, 4, 4, device="cpu"):
        assert not torch.is_inference_mode_enabled() and out.idx.is_inference()


def test_graphed_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        pcops.GraphedPreprocess(16, 4, device="cpu")


# ---------------------------------------------------------------------------------------------
# CUDA (run by the GPU script)

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and a CUDA build")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("radius", [None, 0.3])
def test_cuda_equals_cpu(seed, radius):
    rng = np.random.default_rng(seed)
    clouds = make_clouds(rng, [3000, 17, 1200], scale=1.0, offset=0.0)
    feats = [rng.standard_normal((len(c), 4)).astype(np.float32) for c in clouds]
    cpu = pcops.preprocess(clouds, 256, 16, radius=radius, features=feats)
    gpu = pcops.preprocess(clouds, 256, 16, radius=radius, features=feats, device="cuda")
    for name, x, y in zip(cpu._fields, cpu, gpu):
        assert y.is_cuda and torch.equal(x, y.cpu()), name
    # normalised: the mean is a float64 reduction in another order; coordinates agree to rounding
    cpu = pcops.preprocess(clouds, 256, 16, radius=radius, normalize=True)
    gpu = pcops.preprocess(clouds, 256, 16, radius=radius, normalize=True, device="cuda")
    torch.testing.assert_close(gpu.centres.cpu(), cpu.centres, rtol=0, atol=1e-6)
    for b, c in enumerate(clouds):
        check_one(pcops.preprocess.Preprocessed(*(t.cpu() for t in gpu)), b, c, 256, 16, radius=radius,
                  normalize=True)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("features", [False, True])
def test_cuda_graph_equals_eager(seed, features):
    rng = np.random.default_rng(seed)
    run = pcops.GraphedPreprocess(512, 16, normalize=True, device="cuda", pad_multiple=1024)
    for sizes in ([5000, 3000], [4100, 700], [5000, 3000], [900]):
        clouds = make_clouds(rng, sizes)
        feats = [rng.standard_normal((n, 3)).astype(np.float32) for n in sizes] if features else None
        got = run(clouds, feats)
        want = pcops.preprocess(clouds, 512, 16, normalize=True, features=feats, device="cuda")
        for name, x, y in zip(want._fields, want, got):
            assert torch.equal(x, y), (sizes, name)
    # (5000, 3000) and (4100, 700) pad to one shape: one graph for both, one for [900]
    assert len(run.graphs) == 2


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("graphed,overlap", [(False, True), (True, True), (False, False)])
def test_cuda_stream_equals_eager(seed, graphed, overlap):
    rng = np.random.default_rng(seed)
    clouds = make_clouds(rng, rng.integers(100, 5000, 9).tolist())
    outs = list(pcops.preprocess_stream(clouds, 128, 8, batch_size=4, device="cuda", graphed=graphed,
                                        overlap=overlap))
    assert len(outs) == 3
    for i, o in enumerate(outs):
        ref = pcops.preprocess(clouds[4 * i: 4 * i + 4], 128, 8)
        for name, x, y in zip(ref._fields, ref, o):
            assert torch.equal(x, y.cpu()), (i, name)


# ---------------------------------------------------------------------------------------------
# the command

def run_cmd(args, timeout=300, env=None):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pcops.preprocess", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def write_inputs(folder, rng):
    """Four good clouds in four formats (one in a subfolder) and a broken PLY."""
    clouds = make_clouds(rng, [300, 80, 150, 40])
    (folder / "sub").mkdir(parents=True)
    np.save(folder / "a.npy", clouds[0])
    np.concatenate([clouds[1], np.ones((80, 1), np.float32)], 1).tofile(folder / "b.bin")
    np.savez(folder / "sub" / "c.npz", xyz=clouds[2])
    with open(folder / "d.ply", "wb") as f:
        f.write(b"ply\nformat binary_big_endian 1.0\nelement vertex 40\nproperty float x\nproperty float y\n"
                b"property float z\nend_header\n" + clouds[3].astype(">f4").tobytes())
    (folder / "broken.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 10\n"
                                        b"property float x\nproperty float y\nproperty float z\nend_header\n"
                                        + bytes(50))
    (folder / "notes.txt").write_text("not a cloud")
    names = [folder / "a.npy", folder / "b.bin", folder / "sub" / "c.npz", folder / "d.ply"]
    return {str(p): c for p, c in zip(names, clouds)}


@pytest.mark.parametrize("out_name", ["cache.npz", "cache_dir"])
def test_command_folder_with_a_broken_file(tmp_path, seed, out_name):
    rng = np.random.default_rng(seed)
    clouds = write_inputs(tmp_path / "in", rng)
    out = tmp_path / out_name
    args = [str(tmp_path / "in"), "-o", str(out), "--npoint", "32", "--nsample", "8", "--normalize",
            "--batch-size", "3", "--shard-size", "2", "--device", "cpu"]
    r = run_cmd(args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken.ply" in r.stderr and "truncated" in r.stderr, r.stderr
    assert "4 clouds" in r.stdout and "1 failed" in r.stdout and "clouds/s" in r.stdout and "points/s" in r.stdout
    cache = pio.read_cache(out)
    assert sorted(cache.sources) == sorted(clouds) and len(cache) == 4
    assert cache.settings["npoint"] == 32 and cache.settings["normalize"] is True
    for b, src in enumerate(cache.sources):
        ref = pcops.preprocess(clouds[str(src)], 32, 8, normalize=True)
        np.testing.assert_array_equal(cache.centres[b], ref.centres[0].numpy())
        np.testing.assert_array_equal(cache.idx[b], ref.idx[0].numpy())
        assert cache.lengths[b] == ref.lengths[0] and cache.num_points[b] == len(clouds[str(src)])
        np.testing.assert_array_equal(cache.shift[b], ref.shift[0].numpy())
    if out_name == "cache_dir":
        assert len(pio.cache_shards(out)) == 2  # shard size 2
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["clouds"] == 4 and manifest["settings"] == cache.settings
    before = {f: os.path.getmtime(f) for f in ([out] if out.is_file() else pio.cache_shards(out))}

    # re-run: the four are skipped, the broken one fails again
    r = run_cmd(args)
    assert r.returncode == 1 and "4 already in the cache" in r.stdout and "0 clouds" in r.stdout, r.stdout
    assert {f: os.path.getmtime(f) for f in before} == before

    # the broken file repaired: only it is processed and added
    fixed = make_clouds(rng, [10])[0]
    (tmp_path / "in" / "broken.ply").write_bytes(
        b"ply\nformat ascii 1.0\nelement vertex 10\nproperty float x\nproperty float y\nproperty float z\n"
        b"end_header\n" + "".join(f"{x!r} {y!r} {z!r}\n" for x, y, z in fixed.tolist()).encode())
    r = run_cmd(args)
    assert r.returncode == 0 and "1 clouds" in r.stdout and "0 failed" in r.stdout, r.stdout + r.stderr
    cache = pio.read_cache(out)
    assert len(cache) == 5 and len(set(cache.sources)) == 5

    # other settings: refused, then replaced with --overwrite
    other = [a if a != "32" else "16" for a in args]
    r = run_cmd(other)
    assert r.returncode not in (0, 1) and "other settings" in r.stderr and "--overwrite" in r.stderr
    r = run_cmd(other + ["--overwrite"])
    assert r.returncode == 0, r.stderr
    cache = pio.read_cache(out)
    assert cache.settings["npoint"] == 16 and len(cache) == 5 and cache.centres.shape[1] == 16


@pytest.mark.parametrize("out_name", ["cache.npz", "cache_dir"])
def test_command_cache_inside_the_input_folder_is_not_an_input(tmp_path, seed, out_name):
    # the cache (a .npz, or a folder of .npz shards) written into the folder being processed:
    # a re-run must skip the inputs it holds and never read the cache back as clouds
    rng = np.random.default_rng(seed)
    folder = tmp_path / "in"
    folder.mkdir()
    clouds = make_clouds(rng, [120, 90])
    for i, c in enumerate(clouds):
        np.save(folder / f"s{i}.npy", c)
    out = folder / out_name
    args = [str(folder), "-o", str(out), "--npoint", "16", "--nsample", "4", "--shard-size", "1",
            "--device", "cpu"]
    r = run_cmd(args)
    assert r.returncode == 0 and "2 clouds" in r.stdout and "0 failed" in r.stdout, r.stdout + r.stderr
    r = run_cmd(args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 clouds" in r.stdout and "2 already in the cache" in r.stdout and "0 failed" in r.stdout, r.stdout
    cache = pio.read_cache(out)
    assert sorted(map(str, cache.sources)) == sorted(str(folder / f"s{i}.npy") for i in range(2))


def test_command_ball_query_and_bad_arguments(tmp_path, seed):
    rng = np.random.default_rng(seed)
    c = make_clouds(rng, [50], scale=1.0, offset=0.0)[0]
    np.save(tmp_path / "a.npy", c)
    r = run_cmd([str(tmp_path / "a.npy"), "-o", str(tmp_path / "o.npz"), "--npoint", "8", "--nsample", "4",
                 "--radius", "0.5", "--device", "cpu", "--no-progress"])
    assert r.returncode == 0, r.stderr
    cache = pio.read_cache(tmp_path / "o.npz")
    ref = pcops.preprocess(c, 8, 4, radius=0.5)
    np.testing.assert_array_equal(cache.idx[0], ref.idx[0].numpy())
    assert cache.settings["method"] == "ball_query" and cache.settings["radius"] == 0.5
    r = run_cmd([str(tmp_path), "-o", str(tmp_path / "p.npz"), "--npoint", "8", "--nsample", "4",
                 "--radius", "0.5", "--knn"])
    assert r.returncode == 2 and "not allowed with" in r.stderr
    r = run_cmd([str(tmp_path), "-o", str(tmp_path / "p.npz"), "--npoint", "0", "--nsample", "4"])
    assert r.returncode != 0 and "--npoint must be >= 1" in r.stderr


def test_command_torchrun_split_two_processes_gloo(tmp_path, seed):
    rng = np.random.default_rng(seed)
    clouds = write_inputs(tmp_path / "in", rng)
    out = tmp_path / "shards"
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "pcops.preprocess", str(tmp_path / "in"), "-o", str(out), "--npoint", "24", "--nsample", "4",
           "--device", "cpu", "--no-progress", "--batch-size", "2"]
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=400)
    assert r.returncode != 0, r.stdout + r.stderr  # the broken file fails the run
    assert "broken.ply" in r.stderr and "on 2 processes" in r.stdout, r.stdout + r.stderr
    shards = [os.path.basename(f) for f in pio.cache_shards(out)]
    assert any(s.startswith("shard_0_") for s in shards) and any(s.startswith("shard_1_") for s in shards), shards
    cache = pio.read_cache(out)
    assert sorted(cache.sources) == sorted(clouds)
    for b, src in enumerate(cache.sources):
        ref = pcops.preprocess(clouds[str(src)], 24, 4)
        np.testing.assert_array_equal(cache.idx[b], ref.idx[0].numpy())
    assert json.loads((out / "manifest.json").read_text())["clouds"] == 4
