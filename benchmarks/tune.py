#!/usr/bin/env python3
"""Re-measures the thresholds of the plans (kernels/<op>/plan.cuh, the per-architecture tuning
tables): every path of an op forced on a sweep of sizes around each threshold, timed side by side
in one process, and for each size the fastest path next to the one AUTO takes.

    python benchmarks/tune.py fps [--device cuda] [--reps 30] [--quick]
    python benchmarks/tune.py knn | ball_query | circle_nms | all
    python benchmarks/tune.py knn --device cpu      # the CPU plans' thresholds (kernels/knn.c, ...)

A row where AUTO's path is more than 5 % slower than the fastest is marked "<-": the threshold
that sends that size to AUTO's path is the one to move (the table names it). Every path's
output is checked against AUTO's, bit for bit, before it is timed. CUDA: CUDA events, L2
flushed before each call, medians (benchmarks/common.py time_fn). The printed header names
the device, driver, CUDA and torch: paste the table into the commit that moves a threshold.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import pcops  # noqa: E402,F401
from pcops._paths import force, paths  # noqa: E402
from common import environment_header, time_fn  # noqa: E402


def cloud(B, N, gen, device, dtype=torch.float32):
    return torch.rand(B, N, 3, generator=gen).to(device=device, dtype=dtype)


# op -> list of (label, make_args(gen, device) -> args); sizes around each threshold of the plan
def fps_cases(quick, device):
    # CUDA (kernels/fps/plan.cuh, kTunings): the rows each side of every threshold, by dtype
    # where it has one per dtype; CPU (kernels/fps.c, FPS_TREE_MIN_*): the 1x... rows
    sizes = [(64, 128, 64), (64, 129, 64), (32, 512, 256), (32, 513, 256), (32, 1024, 512),
             (32, 1025, 512), (16, 1500, 700), (16, 2047, 1000), (16, 2048, 1000),
             (8, 4096, 1000), (8, 4097, 1000), (6, 8192, 1000), (6, 8193, 1000),
             (6, 12288, 1000), (6, 12288, 2047), (6, 12288, 2048), (8, 16384, 2047),
             (8, 16384, 2048), (8, 16384, 4096), (4, 32767, 2048), (4, 32768, 2048),
             (1, 120000, 16384), (1, 200000, 20000),
             (1, 2047, 1000), (1, 2048, 1000), (1, 4096, 999), (1, 4096, 1000),
             (1, 100000, 399), (1, 100000, 400)]
    if quick:
        sizes = sizes[::3]
    cases = []
    for dtype in (torch.float32, torch.float64):
        for B, N, npoint in sizes:
            cases.append((f"{B}x{N}->{npoint} {str(dtype)[6:]}",
                          lambda g, d, B=B, N=N, k=npoint, t=dtype: (cloud(B, N, g, d, t), k)))
    return cases


F64 = torch.float64


def knn_cases(quick, device):
    # (B, M, N, k[, dtype]); the CUDA thresholds of kernels/knn/plan.cuh (warp select from k = 16
    # up to N = 1024, grid select k = 64..128, grid from N = 1024 with 8 k <= N up to k = 64,
    # grid_batch k = 5..16, the brute force's splits for few queries), or the CPU's of
    # kernels/knn.c (grid from N = 512 with 8 k <= N)
    if device == "cpu":
        sizes = [(4, 256, 384, 16), (4, 256, 512, 16), (4, 256, 768, 16), (4, 256, 512, 64),
                 (4, 256, 512, 65), (4, 2048, 4096, 16), (4, 2048, 4096, 100),
                 (4, 2048, 4096, 16, F64), (1, 10000, 20000, 16)]
    else:
        sizes = [(32, 512, 1000, 4), (32, 512, 1024, 4), (32, 512, 1024, 8), (32, 512, 1024, 16),
                 (16, 1024, 1024, 32), (16, 1024, 1024, 128), (1, 64, 1000, 8),
                 (16, 4096, 4096, 4), (16, 4096, 4096, 8), (16, 4096, 4096, 16),
                 (16, 4096, 4096, 32), (16, 4096, 4096, 64), (16, 4096, 4096, 64, F64),
                 (16, 4096, 4096, 65, F64), (4, 8192, 8192, 100), (4, 8192, 8192, 129),
                 (8, 16384, 16384, 16), (1, 100000, 100000, 16), (1, 100000, 100000, 64)]
    # feature space, self-kNN of standard normal features (B, N, D, k): the tc path of
    # kernels/knn_nd.cu from kKnnNdTuning's tc_min_d (0: off); D each side of 16 .. 256
    features = [] if device == "cpu" else [
        (32, 1024, 16, 20), (32, 1024, 32, 20), (32, 1024, 64, 20), (32, 1024, 128, 20),
        (32, 1024, 256, 20), (32, 4096, 64, 20), (32, 1024, 64, 1), (32, 1024, 64, 64),
        (8, 256, 64, 20), (4, 8192, 128, 16)]
    if quick:
        sizes = sizes[::3]
        features = features[::3]
    cases = []
    for B, M, N, k, *dt in sizes:
        t = dt[0] if dt else torch.float32
        cases.append((f"{B}x{M}x{N} k={k}" + (" float64" if dt else ""),
                      lambda g, d, B=B, M=M, N=N, k=k, t=t: (cloud(B, M, g, d, t),
                                                             cloud(B, N, g, d, t), k)))
    if device == "cpu":
        # feature space (kernels/knn_nd.c): the blocked path from D = KNN_NDB_MIN_D; self-kNN
        # (query = ref) cloud by cloud from KNN_NDB_SELF_CLOUDS clouds per thread
        threads = torch.get_num_threads()
        nd = [(4, 1024, 1, 20, False), (4, 1024, 2, 20, False), (4, 1024, 4, 20, False),
              (4, 1024, 2, 20, True), (4, 1024, 8, 20, True),
              (2 * threads - 1, 1024, 64, 20, True), (2 * threads, 1024, 64, 20, True),
              (32, 1024, 64, 20, True), (32, 1024, 256, 20, True), (8, 4096, 64, 20, True)]
        for B, N, D, k, self_knn in (nd[::3] if quick else nd):
            def make(g, d, B=B, N=N, D=D, k=k, self_knn=self_knn):
                x = torch.randn(B, N, D, generator=g).to(d)
                return (x, x if self_knn else x.clone(), k)
            cases.append((f"{B}x{N} D={D} k={k} " + ("self" if self_knn else "cross"), make))
    for B, N, D, k in features:
        def self_knn(g, d, B=B, N=N, D=D, k=k):
            x = torch.randn(B, N, D, generator=g).to(d)
            return x, x, k
        cases.append((f"{B}x{N} D={D} k={k} self", self_knn))
    return cases


def ball_query_cases(quick, device):
    # (B, M, N, radius, S); the CUDA thresholds of kernels/ball_query/plan.cuh (split_sorted from
    # 3e7 pairs, the split paths up to 2e9 pairs and S = 64 unless few groups of queries meet
    # long ranges of refs, the grid from N = 16384, 8 warps a split block from N = 8192), or the
    # CPU's of kernels/ball_query.c (grid from N = 512)
    if device == "cpu":
        sizes = [(4, 256, 384, 0.2, 32), (4, 256, 512, 0.2, 32), (4, 256, 768, 0.2, 32),
                 (4, 2048, 4096, 0.1, 32), (4, 2048, 4096, 0.1, 100), (1, 10000, 20000, 0.05, 32)]
    else:
        sizes = [(32, 512, 1024, 0.2, 32), (16, 1024, 2048, 0.1, 32), (16, 1024, 4096, 0.1, 64),
                 (16, 1024, 4096, 0.1, 65), (8, 4096, 8192, 0.05, 32), (4, 4096, 8192, 0.05, 65),
                 (4, 4096, 16384, 0.05, 32), (4, 4096, 16384, 0.05, 65),
                 (4, 16384, 16384, 0.05, 32), (8, 16384, 16384, 0.05, 32),
                 (1, 4096, 200000, 0.02, 32), (1, 4096, 400000, 0.02, 32),
                 (1, 65536, 16384, 0.05, 16)]
    if quick:
        sizes = sizes[::2]
    return [(f"{B}x{M}x{N} r={r} S={S}",
             lambda g, d, B=B, M=M, N=N, r=r, S=S: (cloud(B, M, g, d), cloud(B, N, g, d), r, S))
            for B, M, N, r, S in sizes]


def circle_nms_cases(quick, device):
    sizes = [500, 1000, 2000, 4096, 4097, 16384, 65536, 300000]
    if quick:
        sizes = sizes[::2]

    def boxes(g, d, n):
        side = (n / 2.0) ** 0.5  # about 2 boxes per unit square: radius 1 removes some
        c = torch.rand(n, 2, generator=g) * side
        s = torch.rand(n, generator=g)
        return c.to(d), s.to(d), 1.0
    return [(f"N={n}", lambda g, d, n=n: boxes(g, d, n)) for n in sizes]


CASES = {"fps": ("furthest_point_sample", fps_cases), "knn": ("knn", knn_cases),
         "ball_query": ("ball_query", ball_query_cases),
         "circle_nms": ("circle_nms", circle_nms_cases)}


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(same(x, y) for x, y in zip(a, b))


def tune(name, device, reps, quick, seed):
    op, cases = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if device == "cuda" else None
    print(f"\n## {name} on {device} (seed {seed})\n")
    rows = []
    for label, make in cases(quick, device):
        args = make(gen, device)
        dtype = args[0].dtype
        want = force(op, "auto", *args)
        times = {"auto": time_fn(lambda: force(op, "auto", *args), device, reps=reps, flush=flush)}
        for path in paths(op, device, dtype):
            try:
                got = force(op, path, *args)
            except ValueError:
                continue  # the path cannot take these sizes
            if not same(got, want):
                raise SystemExit(f"{name} {label}: path {path} differs from auto")
            times[path] = time_fn(lambda: force(op, path, *args), device, reps=reps, flush=flush)
        best = min((t, p) for p, t in times.items() if p != "auto")
        rows.append((label, times, best))
    every = sorted({p for _, t, _ in rows for p in t if p != "auto"})
    print("| size | auto ms | " + " | ".join(f"{p} ms" for p in every) + " | fastest | |")
    print("|---|---|" + "---|" * len(every) + "---|---|")
    for label, times, (t_best, p_best) in rows:
        cells = [f"{times[p]:.4f}" if p in times else "-" for p in every]
        flag = "<-" if times["auto"] > 1.05 * t_best else ""
        print(f"| {label} | {times['auto']:.4f} | " + " | ".join(cells) + f" | {p_best} | {flag} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=sorted(CASES) + ["all"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="every third size only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("\n".join(environment_header(f"python benchmarks/tune.py {args.op}")))
    for name in sorted(CASES) if args.op == "all" else [args.op]:
        tune(name, args.device, args.reps, args.quick, args.seed)


if __name__ == "__main__":
    main()
