#!/usr/bin/env python3
"""The peer benchmark's timing of pcops.knn and pcops.ball_query (rows K1-K5, K8, Q1, Q2 of
../shared/peerbench/bench.py: the same sizes, seeds and inputs, a 256 MB buffer zeroed before
each call, a synchronisation, CUDA events around one call from an idle GPU), for the pcops tree
given with --tree (built in place). benchmarks/ab_trees.sh runs it in alternating processes for
two or more trees; lines starting with RESULT are read by benchmarks/ab_summary.py.

    python3 benchmarks/ab_torch.py --tree DIR [--reps 100] [--rows K1,Q1]
"""
import argparse
import os
import statistics
import sys

import torch

KNN_ROWS = [  # id, B, M, N, k; inputs: queries seed 11 + i, refs 21 + i (i: the row number)
    ("K1", 32, 512, 1024, 32),
    ("K2", 16, 4096, 4096, 16),
    ("K3", 16, 4096, 4096, 64),
    ("K4", 8, 16384, 16384, 16),
    ("K5", 1, 100000, 100000, 16),
    ("K8", 16, 1024, 1024, 128),
]
BQ_ROWS = [  # id, B, N, M, radius, S; queries seed 31 + i, refs 41 + i
    ("Q1", 32, 1024, 512, 0.2, 32),
    ("Q2", 16, 4096, 1024, 0.1, 64),
]


def rand_points(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, 3, generator=g, dtype=torch.float32)


def time_calls(fn, reps, flush):
    """Warm-up (2 calls, then up to 10 more while a call is cheap, as the peer benchmark), then
    `reps` calls, each after zeroing the flush buffer and a synchronisation; ms per call."""
    for _ in range(12):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    return ms


def report(rid, label, ms):
    s = sorted(ms)
    n = len(s)
    med = statistics.median(s)
    p10, p90 = s[round(0.1 * (n - 1))], s[round(0.9 * (n - 1))]
    print(f"  {rid} {label:8s} median {med:.4f} p10 {p10:.4f} p90 {p90:.4f} min {s[0]:.4f} ms")
    print(f"RESULT {rid} torch {label} {med:.5f} {p10:.5f} {p90:.5f} {s[0]:.5f} 1 1 1 {n} -")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="the pcops tree (built in place) to import")
    ap.add_argument("--label", default=None, help="its name in the output (default: the folder)")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rows", default=None, help="e.g. K1,Q1 (default: all)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.tree))
    import pcops  # noqa: E402  (the tree given)

    label = args.label or os.path.basename(os.path.abspath(args.tree))
    rows = set(args.rows.split(",")) if args.rows else None
    dev = torch.device("cuda")
    print(f"pcops from {os.path.dirname(pcops.__file__)}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(dev)}")
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=dev)
    for rid, B, M, N, k in KNN_ROWS:
        if rows and rid not in rows:
            continue
        i = int(rid[1:])
        q = rand_points((B, M), 11 + i).to(dev)
        r = rand_points((B, N), 21 + i).to(dev)
        report(rid, label, time_calls(lambda: pcops.knn(q, r, k), args.reps, flush))
    for rid, B, N, M, rad, S in BQ_ROWS:
        if rows and rid not in rows:
            continue
        i = int(rid[1:])
        q = rand_points((B, M), 31 + i).to(dev)
        r = rand_points((B, N), 41 + i).to(dev)
        report(rid, label, time_calls(lambda: pcops.ball_query(q, r, rad, S), args.reps, flush))


if __name__ == "__main__":
    main()
