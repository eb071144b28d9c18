"""Benchmark of furthest_point_sample: pcops (every path) vs a plain PyTorch loop and the peers.

    python benchmarks/bench_fps.py --device cuda [--sizes F1,F2,...] [--quick] [--out FILE]
    python benchmarks/bench_fps.py --device cpu  [--quick] [--out FILE]

B = batch, N = points per cloud, npoint = samples. FPS is a chain of npoint dependent steps, each
a pass over the cloud (or, on the CPU's tree path, over the boxes the new sample can change), so
its floor is the latency of one step rather than bandwidth: the tables print the point-updates
per second (B * N * npoint / time) next to the times.

CUDA: the sizes of issue 9 (F1-F7); "auto" is what pcops.furthest_point_sample runs, the other
columns force one path (pcops._paths.force; "-" where a path cannot take
the size). Every path returns the same bits; the script checks that too.

CPU: pcops against fpsample's fastest exact method, bucket_fps_kdline_sampling (h=7), on uniform
clouds and on the KITTI scan in .data/scans (benchmark-only extra: pip install fpsample). fpsample
is given a start index and pcops starts from the index fpsample actually returns first (fpsample
1.0.2's bucket methods do not start from the index they are given); the "same" column says
whether the indices are equal, or equal up to the order of exactly tied samples (fpsample does
not break ties to the lower index).
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # benchmarks/ and the repository root
import pcops  # noqa: E402
from pcops._paths import paths  # noqa: E402
from common import base_parser, environment_header, fmt_ms, fps_path, print_table, time_fn, try_import  # noqa: E402

CPU_PATHS = paths("furthest_point_sample", "cpu")
CUDA_PATHS = paths("furthest_point_sample", "cuda")

CUDA_SIZES = {  # issue 9
    "F1": (32, 1024, 512), "F2": (16, 4096, 1024), "F3": (8, 16384, 4096), "F4": (6, 10000, 1000),
    "F5": (6, 10000, 10000), "F6": (1, 200_000, 20_000), "F7": (1, 1_000_000, 100_000),
}
KITTI = os.path.join(os.path.dirname(HERE), ".data", "scans", "kitti_velodyne_000000.npy")


def fps_torch_loop(xyz, npoint):
    """FPS as a user would write it in PyTorch: one min-update and one argmax per step."""
    B, N, _ = xyz.shape
    idx = torch.empty(B, npoint, dtype=torch.long, device=xyz.device)
    temp = torch.full((B, N), float("inf"), device=xyz.device, dtype=xyz.dtype)
    farthest = torch.zeros(B, dtype=torch.long, device=xyz.device)
    batch = torch.arange(B, device=xyz.device)
    for j in range(npoint):
        idx[:, j] = farthest
        centre = xyz[batch, farthest].unsqueeze(1)
        temp = torch.minimum(temp, ((xyz - centre) ** 2).sum(-1))
        farthest = temp.argmax(-1)
    return idx


def peer_functions():
    """name -> fn(xyz, npoint) for the peer libraries that are importable here."""
    peers = {}
    p3d = try_import("pytorch3d.ops")
    if p3d is not None:
        peers["pytorch3d"] = lambda xyz, k: p3d.sample_farthest_points(xyz, K=k)[1]
    tc = try_import("torch_cluster")
    if tc is not None:
        def _tc(xyz, k):
            B, N, _ = xyz.shape
            batch = torch.arange(B, device=xyz.device).repeat_interleave(N)
            return tc.fps(xyz.reshape(-1, 3), batch, ratio=k / N)
        peers["torch_cluster"] = _tc
    p2 = try_import("pointnet2_ops.pointnet2_utils")
    if p2 is not None:
        peers["pointnet2_ops"] = lambda xyz, k: p2.furthest_point_sample(xyz.contiguous(), k)
    return peers


def bench_cuda(args):
    names = args.sizes.split(",") if args.sizes else list(CUDA_SIZES)
    if args.quick:
        names = ["F1", "F4"]
    peers = peer_functions()
    print(f"peers importable: {', '.join(peers) or 'none'}")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in names:
        B, N, npoint = CUDA_SIZES[name]
        xyz = torch.rand(B, N, 3, generator=gen).cuda()
        reps = 3 if B * N * npoint > 1e10 else 10
        ref = pcops.furthest_point_sample(xyz, npoint, return_dist2=True)
        t_auto = time_fn(lambda: pcops.furthest_point_sample(xyz, npoint), "cuda", warmup=1, reps=reps)
        times = {}
        for v in CUDA_PATHS:
            if v == "simple" and B * N * npoint > 2e9:
                times[v] = None  # one block per cloud: seconds per call at F6, F7
                continue
            try:
                got = fps_path(xyz, npoint, path=v)
            except ValueError:
                times[v] = None  # the path cannot take this size
                continue
            same = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            t = time_fn(lambda: fps_path(xyz, npoint, path=v), "cuda",
                        warmup=1, reps=reps)
            times[v] = f"{fmt_ms(t)}{'' if same else ' DIFFERS'}"
        peer_times = {}
        for pname, fn in peers.items():
            try:
                peer_times[pname] = time_fn(lambda: fn(xyz, npoint), "cuda", warmup=1, reps=3)
            except Exception as e:  # a peer that rejects this size is reported, not fatal
                peer_times[pname] = None
                print(f"{pname} failed on {name}: {type(e).__name__}: {e}")
        best_peer = min([t for t in peer_times.values() if t is not None], default=None)
        rows.append([name, B, N, npoint, fmt_ms(t_auto), *(times[v] or "-" for v in CUDA_PATHS),
                     f"{B * N * npoint / t_auto / 1e6:.2f}", *(fmt_ms(peer_times[p]) for p in peers),
                     f"{best_peer / t_auto:.1f}x" if best_peer else "-"])
        print("row:", *rows[-1], flush=True)  # in case a later size runs out of time
    header = ["id", "B", "N", "npoint", "auto ms", *(f"{v} ms" for v in CUDA_PATHS), "Gupd/s",
              *(f"{p} ms" for p in peers), "vs best peer"]
    print_table("furthest_point_sample on cuda (median of CUDA events)", header, rows, args.out)


def same_as_fpsample(ours_idx, ours_d2, theirs):
    """'yes' when equal; 'ties' when equal up to the order of exactly tied samples; else 'NO'."""
    if np.array_equal(ours_idx, theirs):
        return "yes"
    if len(ours_idx) != len(theirs) or set(ours_idx.tolist()) != set(theirs.tolist()):
        return "NO"
    for j in np.nonzero(ours_idx != theirs)[0]:
        if not any(0 <= k < len(ours_d2) and ours_d2[k] == ours_d2[j] for k in (j - 1, j + 1)):
            return "NO"
    return f"ties ({int((ours_idx != theirs).sum())} slots)"


def bench_cpu(args):
    fpsample = try_import("fpsample")
    print(f"fpsample importable: {'yes' if fpsample else 'no (pip install fpsample)'}")
    gen = torch.Generator().manual_seed(0)
    clouds = [("uniform", 1, 4096, 1024), ("uniform", 1, 10_000, 1000), ("uniform", 1, 20_000, 2000),
              ("uniform", 1, 100_000, 10_000), ("kitti", 1, 115_384, 16_384),
              ("uniform", 8, 4096, 1024), ("uniform", 32, 1024, 512), ("uniform", 16, 8192, 2048)]
    if args.quick:
        clouds = [("uniform", 1, 10_000, 1000), ("uniform", 8, 4096, 1024)]
    rows = []
    for kind, B, N, npoint in clouds:
        if kind == "kitti":
            if not os.path.exists(KITTI):
                print(f"skipped: {KITTI} missing")
                continue
            xyz = torch.from_numpy(np.load(KITTI)[:, :3].astype(np.float32))[None].contiguous()
        else:
            xyz = torch.rand(B, N, 3, generator=gen)
        start = torch.zeros(B, dtype=torch.long)
        t_fs, same = None, "-"
        if fpsample is not None:
            pts = [np.ascontiguousarray(xyz[b].numpy()) for b in range(B)]
            theirs = [fpsample.bucket_fps_kdline_sampling(p, npoint, h=7, start_idx=0) for p in pts]
            start = torch.tensor([int(t[0]) for t in theirs])
            t_fs = time_fn(lambda: [fpsample.bucket_fps_kdline_sampling(p, npoint, h=7, start_idx=0)
                                    for p in pts], "cpu", warmup=1, reps=5)
        ref = pcops.furthest_point_sample(xyz, npoint, start=start, return_dist2=True)
        if fpsample is not None:
            verdicts = {same_as_fpsample(ref[0][b].numpy(), ref[1][b].numpy(), theirs[b].astype(np.int64))
                        for b in range(B)}
            same = "NO" if "NO" in verdicts else ", ".join(sorted(verdicts))
        t_auto = time_fn(lambda: pcops.furthest_point_sample(xyz, npoint, start=start), "cpu", warmup=1, reps=5)
        times = {}
        for v in CPU_PATHS:
            got = fps_path(xyz, npoint, None, start, path=v)
            ok = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            t = time_fn(lambda: fps_path(xyz, npoint, None, start, path=v),
                        "cpu", warmup=1, reps=3 if v == "simple" else 5)
            times[v] = f"{fmt_ms(t)}{'' if ok else ' DIFFERS'}"
        rows.append([kind, B, N, npoint, fmt_ms(t_auto), *(times[v] for v in CPU_PATHS), fmt_ms(t_fs),
                     f"{t_fs / t_auto:.1f}x" if t_fs else "-", same])
    header = ["cloud", "B", "N", "npoint", "auto ms", *(f"{v} ms" for v in CPU_PATHS),
              "fpsample ms", "fpsample/auto", "same idx"]
    print_table(f"furthest_point_sample on cpu, {torch.get_num_threads()} threads (median wall clock)",
                header, rows, args.out)


def main():
    parser = base_parser(__doc__)
    parser.add_argument("--sizes", default=None, help="CUDA: comma-separated ids of issue 9 (F1..F7)")
    args = parser.parse_args()
    for line in environment_header():
        print(line)
    if args.device == "cpu":
        bench_cpu(args)
    else:
        bench_cuda(args)


if __name__ == "__main__":
    main()
