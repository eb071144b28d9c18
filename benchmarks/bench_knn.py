"""Benchmark of pcops.knn against plain PyTorch (cdist + topk) and the peer libraries.

B = batch, M = queries per cloud, N = refs per cloud, k = neighbours.

    python benchmarks/bench_knn.py --device cpu            # the CPU table
    python benchmarks/bench_knn.py --device cuda           # sizes 1k..100k, k 1..1000, PointNet++
    python benchmarks/bench_knn.py --device cuda --quick   # smoke run
    python benchmarks/bench_knn.py --device cuda --max-n 10000 --max-k 200   # a shorter sweep

Baselines, on the same inputs:
  torch       torch.cdist(q, r).square() then topk(k, largest=False), as a user writes it, in chunks
              of queries when the [B, M, N] distance matrix would not fit --torch-mem-gb
  pytorch3d   pytorch3d.ops.knn_points (return_sorted=True)
  cluster     torch_cluster.knn (flattened batch); stops at k = 100 on CUDA
  mmcv        mmcv.ops.knn (CUDA only; k <= 100)
(pointnet2_ops has no kNN beyond three_nn.) A peer that is not installed or refuses a size shows "-".

CUDA floor: the time no kernel can beat on this GPU, the larger of
  bytes: query + ref read once, dist2 + idx written once, over --bandwidth (3.0e12 B/s, H100 HBM3)
  math:  8 FP32 instructions per (query, ref) pair (3 sub, 3 mul, 2 add; no FMA by contract)
         over --fp32-rate (33.5e12/s: 132 SMs x 128 lanes x 1.98 GHz, one op per lane per clock)
The floor column names the bound (B = bytes, F = math); "of floor" is floor / time.

"pcops brute" and "pcops grid" time each search path forced (pcops._paths;
same results, checked), "pcops ms" is what the selector picks; on CUDA "pcops heap" times the
per-thread heap kernel (the k > 64 brute-force path) on the rows with k <= 64 too.
"""
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]  # this checkout

import pcops  # noqa: E402
from common import base_parser, environment_header, fmt_ms, knn_path, print_table, time_fn, try_import  # noqa: E402
from helpers import rand_points  # noqa: E402

pytorch3d_ops = try_import("pytorch3d.ops")
torch_cluster = try_import("torch_cluster")
mmcv_ops = try_import("mmcv.ops")


# ---------------------------------------------------------------------------------------------
# the contenders: each returns (dist2 [B, M, k], idx [B, M, k]) or raises


def run_pcops(q, r, k):
    return pcops.knn(q, r, k)


def run_pcops_variant(q, r, k, variant):
    return knn_path(q, r, k, path=variant)


def run_torch(q, r, k, mem_bytes):
    B, M, N = q.shape[0], q.shape[1], r.shape[1]
    if k > N:
        raise ValueError("topk needs k <= N")
    chunk = max(1, min(M, mem_bytes // max(1, B * N * 4 * 2)))  # the matrix and topk's copy
    outs = [torch.cdist(q[:, i:i + chunk], r).square().topk(k, dim=-1, largest=False)
            for i in range(0, M, chunk)]
    return torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1)


def run_pytorch3d(q, r, k):
    out = pytorch3d_ops.knn_points(q, r, K=k, return_sorted=True)
    return out.dists, out.idx


def run_cluster(q, r, k):
    B, M, N = q.shape[0], q.shape[1], r.shape[1]
    batch_r = torch.arange(B, device=r.device).repeat_interleave(N)
    batch_q = torch.arange(B, device=q.device).repeat_interleave(M)
    edge = torch_cluster.knn(r.reshape(-1, 3), q.reshape(-1, 3), k, batch_r, batch_q)
    return None, edge  # unsorted edge list: timed only


def run_mmcv(q, r, k):
    return None, mmcv_ops.knn(k, r.contiguous(), q.contiguous(), False)


# ---------------------------------------------------------------------------------------------


def sizes(device, quick):
    """(B, M, N, k, label) rows, cheapest first (the sweep stops at --time-limit-s)."""
    if quick:
        return [(2, 1000, 1000, 16, ""), (32, 512, 1024, 32, "PointNet++"), (1, 200, 5000, 100, "")]
    if device == "cpu":
        rows = [(4, 4096, 4096, k, "target: k=16" if k == 16 else "") for k in (1, 16, 32, 64, 128)]
        rows += [(32, 512, 1024, 32, "PointNet++ SA"), (16, 1024, 1024, 20, "DGCNN"),
                 (1, 16384, 16384, 16, ""), (1, 1000, 100000, 16, "few queries"),
                 (2, 2048, 2048, 200, ""), (1, 1024, 8192, 1000, "")]
        return rows
    rows = [(32, 512, 1024, 32, "PointNet++ SA1"), (32, 128, 512, 64, "PointNet++ SA2"),
            (16, 1024, 1024, 20, "DGCNN"), (1, 1000, 100000, 16, "few queries")]
    for n in (1_000, 10_000, 100_000):
        for B in (1, 8):
            for k in (1, 16, 64, 128, 200, 1000):
                if k <= n:
                    rows.append((B, n, n, k, ""))
    return rows


def floor_ms(B, M, N, k, bandwidth, fp32_rate):
    bytes_moved = (B * M * 3 + B * N * 3) * 4 + B * M * k * (4 + 8)
    t_bytes = bytes_moved / bandwidth
    t_math = B * M * N * 8 / fp32_rate
    return (t_bytes * 1e3, "B") if t_bytes >= t_math else (t_math * 1e3, "F")


def timed(fn, device, budget_s):
    """(median ms, output of the first call) of fn(): the first call warms up and estimates the
    time, then as many repetitions as fit in budget_s (1 to 20). (None, None) if it raises."""
    try:
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        est_s = time.perf_counter() - t0
    except Exception as e:  # a peer's cap on k, out of memory, ...
        msg = str(e).splitlines()[0][:60] if str(e) else type(e).__name__
        print(f"    (skipped: {msg})", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        return None, None
    reps = int(max(1, min(20, budget_s / max(est_s, 1e-6))))
    return time_fn(fn, device, warmup=0 if reps < 3 else 1, reps=reps), out


def check_same(a, b, what):
    """The contenders must agree before their times mean anything: sorted distances within
    float32 rounding (indices may differ at near-ties)."""
    if a is None or b is None:
        return
    da, db = a.double(), b.double()
    bad = ~torch.isclose(da, db, rtol=1e-4, atol=1e-6)
    if bad.any():
        raise SystemExit(f"{what}: distances differ from pcops at {int(bad.sum())} places")


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--bandwidth", type=float, default=3.0e12, help="bytes/s for the CUDA floor")
    p.add_argument("--fp32-rate", type=float, default=33.5e12, help="FP32 ops/s for the CUDA floor")
    p.add_argument("--torch-mem-gb", type=float, default=4.0, help="memory for one cdist chunk")
    p.add_argument("--budget-s", type=float, default=1.0, help="time spent per measurement")
    p.add_argument("--max-n", type=int, default=None, help="skip sizes with more refs than this")
    p.add_argument("--max-k", type=int, default=None, help="skip sizes with a larger k")
    p.add_argument("--time-limit-s", type=float, default=240.0,
                   help="start no new size after this long (the GPU script kills at 300 s)")
    args = p.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    for line in environment_header():
        print(line)
    peers = [("pytorch3d", pytorch3d_ops, run_pytorch3d), ("cluster", torch_cluster, run_cluster),
             ("mmcv", mmcv_ops if device == "cuda" else None, run_mmcv)]
    present = [(name, fn) for name, mod, fn in peers if mod is not None]
    print("peers found: " + (", ".join(n for n, _ in present) or "none"))
    gen = torch.Generator().manual_seed(0)
    mem_bytes = int(args.torch_mem_gb * 2**30)
    budget = 0.2 if args.quick else args.budget_s

    variants = ["brute", "grid"] + (["brute_heap"] if device == "cuda" else [])
    header = ["B", "M", "N", "k", "shape", "pcops ms"] + [f"pcops {v} ms" for v in variants]
    header += ["torch ms"] + [f"{n} ms" for n, _ in present]
    header += ["speedup vs torch", "speedup vs best peer"]
    if device == "cuda":
        header += ["floor ms", "of floor"]
    rows, not_run = [], []
    start = time.perf_counter()
    for B, M, N, k, label in sizes(device, args.quick):
        if (args.max_n and N > args.max_n) or (args.max_k and k > args.max_k):
            continue
        if time.perf_counter() - start > args.time_limit_s:
            not_run.append(f"B={B} M={M} N={N} k={k}")
            continue
        print(f"  B={B} M={M} N={N} k={k} ...", flush=True)
        q = rand_points(B, M, gen, device=device)
        r = rand_points(B, N, gen, device=device)
        t_ours, ours = timed(lambda: run_pcops(q, r, k), device, budget)
        if ours is None:
            raise SystemExit(f"pcops.knn failed on B={B} M={M} N={N} k={k}")
        t_vars = []
        for v in variants:
            if v == "brute_heap" and k > 64:
                t_vars.append(None)
                continue
            t_v, out = timed(lambda v=v: run_pcops_variant(q, r, k, v), device, budget)
            if out is not None and not (torch.equal(out[1], ours[1]) and torch.equal(out[0], ours[0])):
                raise SystemExit(f"the {v} variant returned other results than the default path")
            t_vars.append(t_v)
        t_torch, out = timed(lambda: run_torch(q, r, k, mem_bytes), device, budget)
        check_same(None if out is None else out[0], ours[0], "torch cdist+topk")
        t_peers = []
        for name, fn in present:
            t, out = timed(lambda fn=fn: fn(q, r, k), device, budget)
            check_same(None if out is None else out[0], ours[0], name)
            t_peers.append(t)
        best_peer = min((t for t in t_peers if t is not None), default=None)
        row = [B, M, N, k, label, fmt_ms(t_ours)] + [fmt_ms(t) for t in t_vars]
        row += [fmt_ms(t_torch)] + [fmt_ms(t) for t in t_peers]
        row.append(f"{t_torch / t_ours:.2f}x" if t_torch and t_ours else "-")
        row.append(f"{best_peer / t_ours:.2f}x" if best_peer and t_ours else "-")
        if device == "cuda":
            f_ms, bound = floor_ms(B, M, N, k, args.bandwidth, args.fp32_rate)
            row += [f"{fmt_ms(f_ms)} {bound}", f"{f_ms / t_ours:.0%}" if t_ours else "-"]
        print("    " + "  ".join(str(c) for c in row), flush=True)
        rows.append(row)
        del q, r, ours, out
        if device == "cuda":
            torch.cuda.empty_cache()
    print()
    title = f"pcops.knn on {device}: median ms (lower is better)"
    if not_run:
        title += f"; not run (--time-limit-s {args.time_limit_s:g}): " + ", ".join(not_run)
    print_table(title, header, rows, file=args.out)


if __name__ == "__main__":
    main()
