"""CPU: pcops.knn / pcops.ball_query (grid and brute force) against k-d trees (issue 8).

    pip install -r benchmarks/requirements.txt      # scipy, pykdtree (benchmark-only)
    python benchmarks/bench_cpu_trees.py             # all rows, torch.get_num_threads() threads
    python benchmarks/bench_cpu_trees.py --quick     # fewer repetitions

Rows: kNN k=16 at B=4 M=N=4096 (uniform), B=1 M=N=100000 (uniform) and the KITTI scan against
itself; ball query at the same sizes with r chosen so that ~32 neighbours fall in range
(uniform: r = (32 * 3 / (4 pi N))^(1/3); KITTI: r = 0.5 m measured to give ~32 on average;
printed). Contenders, in one process on the same float32 inputs, tree build included:
  scipy     scipy.spatial.cKDTree(ref).query(query, k, workers=W) / query_ball_point(workers=W)
  pykdtree  pykdtree.kdtree.KDTree(ref).query(query, k) (threads via OMP_NUM_THREADS)
Ball query: cKDTree returns every neighbour (unsorted, unbounded lists); pcops returns the first
32 by index. Times: median of --reps calls after one warm-up, in ms.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
import pcops  # noqa: E402
from common import ball_query_path, knn_path  # noqa: E402


def median_ms(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def clouds(name, gen):
    if name == "kitti":
        scan = np.load(os.path.join(ROOT, ".data", "scans", "kitti_velodyne_000000.npy"))[:, :3]
        x = torch.from_numpy(np.ascontiguousarray(scan, dtype=np.float32))[None]
        return x, x
    B, N = {"B4_4096": (4, 4096), "B1_100k": (1, 100000)}[name]
    x = torch.rand(B, N, 3, generator=gen)
    return x, x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", default="B4_4096,B1_100k,kitti")
    ap.add_argument("--no-brute", action="store_true", help="skip the brute-force column")
    args = ap.parse_args()
    reps = 2 if args.quick else args.reps
    W = torch.get_num_threads()
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        cKDTree = None
    try:
        from pykdtree.kdtree import KDTree
    except ImportError:
        KDTree = None
    print(f"# torch threads {W}, pcops {pcops.__version__}, {os.cpu_count()} CPUs")
    gen = torch.Generator().manual_seed(0)
    k = 16
    print("| op | size | pcops grid ms | pcops brute ms | scipy ms | pykdtree ms | best tree / grid |")
    print("|---|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        q, r = clouds(name, gen)
        qn, rn = q.numpy(), r.numpy()
        t_grid = median_ms(lambda: knn_path(q, r, k, path="grid"), reps)
        t_brute = float("nan") if args.no_brute or name != "B4_4096" else median_ms(
            lambda: knn_path(q, r, k, path="brute"), reps)
        t_sp = t_kd = float("nan")
        if cKDTree is not None:
            t_sp = median_ms(lambda: [cKDTree(rn[b]).query(qn[b], k, workers=W) for b in range(len(rn))], reps)
        if KDTree is not None:
            t_kd = median_ms(lambda: [KDTree(rn[b]).query(qn[b], k) for b in range(len(rn))], reps)
        best = np.nanmin([t_sp, t_kd])
        print(f"| knn k={k} | {name} | {t_grid:.2f} | {t_brute:.2f} | {t_sp:.2f} | {t_kd:.2f} | {best / t_grid:.2f}x |")
    for name in args.rows.split(","):
        q, r = clouds(name, gen)
        qn, rn = q.numpy(), r.numpy()
        N = r.shape[1]
        radius = 0.5 if name == "kitti" else (32 * 3 / (4 * np.pi * N)) ** (1 / 3)
        idx, cnt = ball_query_path(q, r, radius, 32, path="grid")
        t_grid = median_ms(lambda: ball_query_path(q, r, radius, 32, path="grid"), reps)
        t_sp = mean_in_range = float("nan")  # without scipy: the pcops column only
        if cKDTree is not None:
            t_sp = median_ms(
                lambda: [cKDTree(rn[b]).query_ball_point(qn[b], radius, workers=W) for b in range(len(rn))], reps)
            mean_in_range = np.mean([len(x) for x in cKDTree(rn[0]).query_ball_point(qn[0][:2000], radius)])
        print(f"| ball r={radius:.4g} (~{mean_in_range:.0f} in range) S=32 | {name} | {t_grid:.2f} | - | {t_sp:.2f} | - | {t_sp / t_grid:.2f}x |")


if __name__ == "__main__":
    main()
