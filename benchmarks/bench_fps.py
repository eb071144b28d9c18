"""Benchmark of furthest_point_sample: pcops vs a plain PyTorch loop and the peers (when installed).

    python benchmarks/bench_fps.py [--device cpu|cuda] [--quick] [--out FILE]

B = batch, N = points per cloud, npoint = samples. FPS is a chain of npoint dependent steps, each
a pass over the cloud, so its floor is latency and per-SM throughput rather than DRAM bandwidth:
the table prints the point-updates per second (B * N * npoint / time) next to the times.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # benchmarks/ and the repository root
import pcops  # noqa: E402
from common import base_parser, environment_header, fmt_ms, print_table, time_fn, try_import  # noqa: E402


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


def main():
    args = base_parser(__doc__).parse_args()
    dev = args.device
    if dev == "cpu":
        sizes = [(8, 4096, 1024), (32, 1024, 512), (1, 100_000, 1000), (16, 8192, 2048)]
    else:
        sizes = [(32, 1024, 512), (32, 512, 128), (16, 4096, 1024), (8, 8192, 2048),
                 (8, 20_000, 4096), (1, 200_000, 20_000), (1, 1_000_000, 4096)]
    if args.quick:
        sizes = [(2, 1000, 100), (8, 4096, 1024)] if dev == "cpu" else [(32, 1024, 512), (1, 200_000, 2000)]
    peers = peer_functions()
    loop_limit = 4096 if dev == "cpu" else 20_000  # npoint beyond which the PyTorch loop is skipped
    for line in environment_header():
        print(line)
    print(f"peers importable: {', '.join(peers) or 'none'}")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B, N, npoint in sizes:
        xyz = torch.rand(B, N, 3, generator=gen).to(dev)
        reps = 3 if B * N * npoint > 1e10 else 10
        t_pcops = time_fn(lambda: pcops.furthest_point_sample(xyz, npoint), dev, warmup=1, reps=reps)
        t_loop = None
        if npoint <= loop_limit and (dev != "cpu" or B * N * npoint <= 1e9):
            t_loop = time_fn(lambda: fps_torch_loop(xyz, npoint), dev, warmup=1, reps=3)
        variants = {}
        if dev != "cpu":  # the two CUDA kernels, forced (identical results; the default picks by size)
            for v, name in (("1", "block"), ("2", "cluster")):
                os.environ["PCOPS_FPS_VARIANT"] = v
                variants[name] = time_fn(lambda: pcops.furthest_point_sample(xyz, npoint), dev, warmup=1, reps=reps)
            del os.environ["PCOPS_FPS_VARIANT"]
        peer_times = {}
        for name, fn in peers.items():
            try:
                peer_times[name] = time_fn(lambda: fn(xyz, npoint), dev, warmup=1, reps=3)
            except Exception as e:  # a peer that rejects this size is reported, not fatal
                peer_times[name] = None
                print(f"{name} failed on B={B} N={N} npoint={npoint}: {type(e).__name__}: {e}")
        best_other = min([t for t in [t_loop, *peer_times.values()] if t is not None], default=None)
        rows.append([B, N, npoint, fmt_ms(t_pcops), *(fmt_ms(t) for t in variants.values()),
                     f"{B * N * npoint / t_pcops / 1e6:.2f}",
                     fmt_ms(t_loop), *(fmt_ms(peer_times[p]) for p in peers),
                     f"{best_other / t_pcops:.1f}x" if best_other else "-"])
    header = ["B", "N", "npoint", "pcops ms", *(["block ms", "cluster ms"] if dev != "cpu" else []), "Gupd/s", "torch loop ms", *(f"{p} ms" for p in peers),
              "speedup vs best other"]
    print_table(f"furthest_point_sample on {dev} (median of CUDA events / wall clock)", header, rows,
                args.out)


if __name__ == "__main__":
    main()
