#!/usr/bin/env python3
"""Is one pcops tree slower than another on the rows of the peer benchmark? An A/B in one call.

Times pcops alone on every row of the peer benchmark (../shared/peerbench/bench.py: F1-F7,
K1-K8, Q1-Q3, C1-C4, the same sizes, seeds and inputs, and its method: a 256 MB buffer zeroed
and a synchronisation before each call, CUDA events around one call, the median), for two or more
pcops trees, each built in place beforehand. Each tree is timed in its own processes, alternating
A B B A A B ..., so that a fresh process or a drifting clock moves both trees alike:

    python3 benchmarks/ab_rows.py --peerbench .peerbench --kitti SCAN.npy \\
        [--procs 4] [--reps 30] [--rows F1,K1] old=DIR new=DIR

prints, per row, each tree's median over its processes of their medians, the new/old ratio and
the spread of the reference's process medians (the noise floor). One process of one tree:

    python3 benchmarks/ab_rows.py --peerbench .peerbench --one DIR [--rows ...]

prints lines `RESULT <row> <ms>`.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def rows(bench, kitti):
    """(row id, fn factory): each factory makes the inputs on the GPU and returns the call."""
    import numpy as np
    import torch

    import pcops

    dev = torch.device("cuda")
    out = []
    fps_rows = list(bench.FPS_ROWS) + [bench.F7 + (False,)]
    for rid, B, N, M, seed, _ in fps_rows:
        def make(B=B, N=N, M=M, seed=seed):
            x = bench.rand_points((B, N), seed).to(dev)
            return lambda: pcops.furthest_point_sample(x, M)
        out.append((rid, make))
    for i, (rid, B, M, N, k) in enumerate(bench.KNN_ROWS):
        def make(rid=rid, B=B, M=M, N=N, k=k, i=i):
            if rid == "K6":
                pts = np.load(kitti)[:, :3].astype(np.float32)
                q = torch.from_numpy(pts).unsqueeze(0).to(dev)
                r = q
            else:
                q = bench.rand_points((B, M), 11 + i).to(dev)
                r = bench.rand_points((B, N), 21 + i).to(dev)
            return lambda: pcops.knn(q, r, k)
        out.append((rid, make))
    for i, (rid, B, N, M, rad, S) in enumerate(bench.BQ_ROWS):
        def make(B=B, N=N, M=M, rad=rad, S=S, i=i):
            q = bench.rand_points((B, M), 31 + i).to(dev)
            r = bench.rand_points((B, N), 41 + i).to(dev)
            return lambda: pcops.ball_query(q, r, rad, S, return_count=True)
        out.append((rid, make))
    for rid, n in bench.NMS_ROWS:
        def make(n=n):
            c, s = bench.nms_inputs(n)
            c, s = c.to(dev), s.to(dev)
            return lambda: pcops.circle_nms(c, s, bench.NMS_RADIUS)
        out.append((rid, make))
        def make_mask(n=n):
            c, s = bench.nms_inputs(n)
            c, s = c.to(dev), s.to(dev)
            return lambda: pcops.circle_nms_mask(c, s, bench.NMS_RADIUS)
        out.append((rid + "mask", make_mask))
    return out


def one(args):
    sys.path.insert(0, os.path.abspath(args.one))
    sys.path.insert(1, os.path.abspath(args.peerbench))
    import torch

    import bench  # the peer benchmark's rows and inputs
    from ab_torch import time_calls  # this script's folder, the same timing as the torch A/B

    import pcops
    assert os.path.dirname(pcops.__file__).startswith(os.path.abspath(args.one)), pcops.__file__
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    want = set(args.rows.split(",")) if args.rows else None
    for rid, make in rows(bench, args.kitti):
        if want and rid not in want and rid.replace("mask", "") not in want:
            continue
        fn = make()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        est = (time.perf_counter() - t0) / 3
        reps = args.reps if est < 0.02 else max(5, min(args.reps, int(1.0 / est)))
        ms = time_calls(fn, reps, flush)
        print(f"RESULT {rid} {statistics.median(ms):.5f}", flush=True)


def compare(args):
    trees = [t.split("=", 1) for t in args.trees]
    order = []
    for p in range(args.procs):  # A B B A A B ...
        order += trees if p % 2 == 0 else trees[::-1]
    meds = {label: {} for label, _ in trees}
    for label, tree in order:
        cmd = [sys.executable, __file__, "--one", tree, "--peerbench", args.peerbench,
               "--kitti", args.kitti, "--reps", str(args.reps)]
        if args.rows:
            cmd += ["--rows", args.rows]
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{label}: rc {res.returncode}\n{res.stderr[-3000:]}", flush=True)
            continue
        for line in res.stdout.splitlines():
            if line.startswith("RESULT "):
                _, rid, ms = line.split()
                meds[label].setdefault(rid, []).append(float(ms))
        print(f"# process {label} done in {time.time() - t0:.1f} s", flush=True)
    ref = trees[0][0]
    labels = [label for label, _ in trees]
    head = "| row | " + " | ".join(f"{x} ms" for x in labels) + " | " + \
        " | ".join(f"{x}/{ref}" for x in labels[1:]) + f" | {ref} spread |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for rid in meds[ref]:
        m = {x: statistics.median(meds[x][rid]) for x in labels if meds[x].get(rid)}
        r = meds[ref][rid]
        spread = (max(r) - min(r)) / statistics.median(r) if len(r) > 1 else 0.0
        cells = [f"{m[x]:.4f}" if x in m else "-" for x in labels]
        ratios = [f"{m[x] / m[ref]:.3f}" if x in m else "-" for x in labels[1:]]
        print(f"| {rid} | " + " | ".join(cells) + " | " + " | ".join(ratios) +
              f" | {100 * spread:.1f} % |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peerbench", default=".peerbench")
    ap.add_argument("--kitti", default=".data/scans/kitti_velodyne_000000.npy")
    ap.add_argument("--one", help="time the tree in this directory, in this process")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rows", default="")
    ap.add_argument("trees", nargs="*", help="LABEL=DIR, the first is the reference")
    args = ap.parse_args()
    if args.one:
        one(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
