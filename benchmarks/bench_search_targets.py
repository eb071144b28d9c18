"""The issue-8 rows (K1..K8, Q1..Q3) for each search path of pcops.knn / pcops.ball_query.

    python benchmarks/bench_search_targets.py --device cuda     # the H100 rows
    python benchmarks/bench_search_targets.py --device cpu --rows K2,Q2

Times each forced path (pcops._paths: brute, grid, brute_heap for kNN on CUDA) and
the default (auto) path; checks that every path returns the auto path's bits. CUDA: median
of --reps calls timed with events after a warm-up (no L2 flush: the peer benchmark in
../shared/peerbench is the reference for the issue table). Uniform points in the unit cube;
K6 is the KITTI scan against itself (.data/scans).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]
from benchmarks.common import ball_query_path, knn_path  # noqa: E402

KNN_ROWS = {  # id: (B, M, N, k, target ms on the H100)
    "K1": (32, 512, 1024, 32, 0.12), "K2": (16, 4096, 4096, 16, 0.15),
    "K3": (16, 4096, 4096, 64, 0.80), "K4": (8, 16384, 16384, 16, 0.30),
    "K5": (1, 100000, 100000, 16, 0.30), "K6": (1, None, None, 16, 1.5),
    "K7": (1, 100000, 100000, 64, 1.5), "K8": (16, 1024, 1024, 128, 0.25),
}
BQ_ROWS = {  # id: (B, N, M, r, S, target)
    "Q1": (32, 1024, 512, 0.2, 32, 0.03), "Q2": (16, 4096, 1024, 0.1, 64, 0.06),
    "Q3": (1, 1000000, 100000, 0.05, 32, 1.0),
}


def timed(fn, device, reps):
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts), out
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default=",".join(list(KNN_ROWS) + list(BQ_ROWS)))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda":
        print(f"# {torch.cuda.get_device_name(0)}")
    gen = torch.Generator().manual_seed(0)
    variants = ["auto", "brute", "grid"] + (["brute_heap"] if dev == "cuda" else [])
    print("| id | size | " + " | ".join(f"{v} ms" for v in variants) + " | target ms |")
    print("|---|---|" + "---|" * (len(variants) + 1))
    for rid in args.rows.split(","):
        if rid in KNN_ROWS:
            B, M, N, k, target = KNN_ROWS[rid]
            if N is None:
                scan = np.load(os.path.join(ROOT, ".data", "scans", "kitti_velodyne_000000.npy"))[:, :3]
                q = r = torch.from_numpy(np.ascontiguousarray(scan, dtype=np.float32))[None].to(dev)
                size = f"KITTI {scan.shape[0]} self k={k}"
            else:
                q = torch.rand(B, M, 3, generator=gen).to(dev)
                r = torch.rand(B, N, 3, generator=gen).to(dev)
                size = f"B={B} M={M} N={N} k={k}"
            times, ref = [], None
            for v in variants:
                t, out = timed(lambda v=v: knn_path(q, r, k, path=v), dev, args.reps)
                if ref is None:
                    ref = out
                elif not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                    raise SystemExit(f"{rid}: variant {v} differs from auto")
                times.append(t)
        elif rid in BQ_ROWS:
            B, N, M, rad, S, target = BQ_ROWS[rid]
            r = torch.rand(B, N, 3, generator=gen).to(dev)
            q = r[:, :M].contiguous()
            size = f"ball B={B} N={N} M={M} r={rad} S={S}"
            times, ref = [], None
            for v in variants:
                if v == "brute_heap":
                    times.append(float("nan"))
                    continue
                t, out = timed(lambda v=v: ball_query_path(q, r, rad, S, path=v), dev, args.reps)
                if ref is None:
                    ref = out
                elif not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                    raise SystemExit(f"{rid}: variant {v} differs from auto")
                times.append(t)
        else:
            raise SystemExit(f"unknown row {rid}")
        print(f"| {rid} | {size} | " + " | ".join(f"{t:.3f}" for t in times) + f" | {target} |", flush=True)


if __name__ == "__main__":
    main()
