"""FPS on CUDA: the auto path against the forced paths on the issue 9 sizes and real scans.

    python benchmarks/bench_fps_shapes.py [--rows F1,F4,KITTI] [--paths bucket,grid] [--reps 7] [--out FILE]
    python benchmarks/bench_fps_shapes.py --once KITTI --paths bucket    # one call, for ncu

Rows: the issue 9 sizes F1-F6 (torch.rand clouds, seed 0) and the KITTI scan of .data/scans
(115 384 points -> 16 384), one scan and 8 scans (KITTI and nuScenes, ragged). Every cell is
the median of `reps` calls timed with CUDA events, each after a 256 MiB write that flushes the
L2; every forced path is checked bit for bit (idx and dist2) against the simple path's result
computed once per row (the bucket path for rows where simple takes seconds). (Shapes of
paths that lost -- the cluster_bucket and bucket_lane paths of branch fpsbig -- were compared
with earlier versions of this script; the tables are in benchmarks/results/.)
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import pcops  # noqa: E402
from common import fps_path, time_fn  # noqa: E402

SIZES = {"F1": (32, 1024, 512), "F2": (16, 4096, 1024), "F3": (8, 16384, 4096),
         "F4": (6, 10000, 1000), "F5": (6, 10000, 10000), "F6": (1, 200_000, 20_000)}
SCANS = os.path.join(os.path.dirname(HERE), ".data", "scans")

# (label, variant) tried on each row; paths that refuse a size print "-"
PATHS = [("warp", "warp"), ("block", "block"), ("block_pruned", "block_pruned"),
         ("cluster", "cluster"), ("bucket", "bucket"),
         ("bucket_groups", "bucket_groups"), ("bucket_rounds", "bucket_rounds"),
         ("bucket_rounds_cluster", "bucket_rounds_cluster"), ("grid", "grid")]


def row_inputs(name, gen):
    """(xyz, npoint, lengths) on the GPU."""
    if name in SIZES:
        B, N, npoint = SIZES[name]
        return torch.rand(B, N, 3, generator=gen).cuda(), npoint, None
    kitti = np.load(os.path.join(SCANS, "kitti_velodyne_000000.npy"))[:, :3].astype(np.float32)
    if name == "KITTI":
        return torch.from_numpy(kitti)[None].cuda(), 16384, None
    nusc = np.load(os.path.join(SCANS, "nuscenes_lidar_top_1532402927647951.npy"))[:, :3].astype(np.float32)
    clouds = [kitti, nusc] * 4  # KITTIx8: 8 scans, ragged
    N = max(len(c) for c in clouds)
    xyz = torch.zeros(len(clouds), N, 3)
    for b, c in enumerate(clouds):
        xyz[b, :len(c)] = torch.from_numpy(c)
    lengths = torch.tensor([len(c) for c in clouds])
    return xyz.cuda(), 16384, lengths.cuda()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="F1,F2,F3,F4,F5,F6,KITTI,KITTIx8")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--paths", default="", help="labels to time (default: all)")
    ap.add_argument("--out", default="")
    ap.add_argument("--once", default="", help="run the first of --paths once on this row and exit")
    args = ap.parse_args()
    if args.once:  # for a profiler: one call of one path, nothing else on the GPU
        xyz, npoint, lengths = row_inputs(args.once, torch.Generator().manual_seed(0))
        fps_path(xyz, npoint, lengths, path=args.paths.split(",")[0] or "auto")
        torch.cuda.synchronize()
        return
    p = torch.cuda.get_device_properties(0)
    lines = [f"# {' '.join(sys.argv)}",
             f"# {p.name}, {p.multi_processor_count} SMs, torch {torch.__version__} (CUDA {torch.version.cuda})",
             f"# median of {args.reps} event-timed calls, L2 flushed before each; ms"]
    paths = [q for q in PATHS if not args.paths or q[0] in args.paths.split(",")]
    header = ["row", "auto"] + [q[0] for q in paths]
    lines.append(" | ".join(header))
    for line in lines:
        print(line, flush=True)
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    gen = torch.Generator().manual_seed(0)
    for name in args.rows.split(","):
        xyz, npoint, lengths = row_inputs(name, gen)
        B, N = xyz.shape[:2]
        reps = args.reps if B * N * npoint < 5e9 else max(3, args.reps // 2)
        ref_path = "simple" if B * N * npoint < 2e9 else "bucket"
        ref = fps_path(xyz, npoint, lengths, path=ref_path)
        auto = pcops.furthest_point_sample(xyz, npoint, lengths, return_dist2=True)
        t = time_fn(lambda: pcops.furthest_point_sample(xyz, npoint, lengths), "cuda", warmup=1,
                    reps=reps, flush=flush)
        cells = [name, f"{t:.3f}"
                 + ("" if torch.equal(auto[0], ref[0]) and torch.equal(auto[1], ref[1]) else " DIFFERS")]
        for label, variant in paths:
            if (variant == "grid" and N < 100_000) or (variant == "cluster" and N > 20_000 and B > 1):
                cells.append("-")  # tens to hundreds of ms there: not a candidate
                continue
            try:
                got = fps_path(xyz, npoint, lengths, path=variant)
            except (ValueError, RuntimeError) as e:
                cells.append("-" if isinstance(e, ValueError) else f"ERR {str(e)[:60]}")
                continue
            same = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            t = time_fn(lambda: fps_path(xyz, npoint, lengths, path=variant), "cuda",
                        warmup=1, reps=reps, flush=flush)
            cells.append(f"{t:.3f}" + ("" if same else " DIFFERS"))
        lines.append(" | ".join(cells))
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
