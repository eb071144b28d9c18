"""Benchmark of pcops.knn in feature space (D != 3) against the plain-torch kNN of DGCNN and the
peer libraries: the sizes of issue 36 (B = 32, N = 1024, k = 20, D = 64 / 128 / 256; N = 4096).

    python benchmarks/bench_knn_nd.py --device cuda
    python benchmarks/bench_knn_nd.py --device cpu
    python benchmarks/bench_knn_nd.py --device cpu --quick     # smoke run
    python benchmarks/bench_knn_nd.py --device cpu --threads 2 # torch and pcops on 2 threads

Every row is a self-kNN (query = ref, as an EdgeConv layer builds its graph), float32.
Contenders, on the same inputs:
  pcops        pcops.knn(x, x, k) (exact; the plan's path: on the CPU the blocked path, which
               visits each pair of a self-kNN once; on CUDA the tensor-core shortlist where the
               tuning table takes it)
  tc           pcops's tensor-core shortlist forced (pcops._paths.force("knn", "tc", ...); exact,
               the same bits as pcops, checked before timing; CUDA sm_80+ only)
  torch        DGCNN's knn: -|x_i|^2 + 2 x_i.x_j - |x_j|^2 by one batched matmul, then topk(k)
               (not exact: cancellation in the product form)
  pytorch3d    pytorch3d.ops.knn_points(x, x, K=k)
  cluster      torch_cluster.knn over the flattened batch
A peer that is not installed or refuses a size shows "-". "torch/pcops" is the plain-torch time
over pcops's. --threads sets torch.set_num_threads, which pcops's OpenMP regions share (one
libgomp in the process). "agree" is the fraction of pcops's
neighbour indices that the torch baseline also returns (a measure of its inexactness).
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]  # this checkout

import pcops  # noqa: E402
from pcops._paths import force  # noqa: E402
from common import base_parser, environment_header, fmt_ms, print_table, time_fn, try_import  # noqa: E402

pytorch3d_ops = try_import("pytorch3d.ops")
torch_cluster = try_import("torch_cluster")


def run_torch(x, k):
    inner = torch.matmul(x, x.transpose(1, 2))
    sq = (x * x).sum(-1, keepdim=True)
    neg = 2 * inner - sq - sq.transpose(1, 2)
    return neg.topk(k, dim=-1)[1]


def run_pytorch3d(x, k):
    return pytorch3d_ops.knn_points(x, x, K=k).idx


def run_cluster(x, k, batch):
    flat = x.reshape(-1, x.shape[-1])
    return torch_cluster.knn(flat, flat, k, batch, batch)


def main():
    p = base_parser(__doc__)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    sizes = [(32, 1024, 64, 20), (32, 1024, 128, 20), (32, 1024, 256, 20), (32, 4096, 64, 20)]
    if args.quick:
        sizes = [(4, 256, 64, 20)]
    reps = 3 if args.quick or dev == "cpu" else 20
    rows = []
    for B, N, D, k in sizes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, N, D, generator=g).to(dev)
        batch = torch.arange(B, device=dev).repeat_interleave(N)
        _, idx = pcops.knn(x, x, k)
        t_pcops = time_fn(lambda: pcops.knn(x, x, k), dev, reps=reps)
        t_tc = None
        if dev == "cuda" and torch.cuda.get_device_capability()[0] >= 8:
            d_tc, i_tc = force("knn", "tc", x, x, k, None, None)
            d_ref, _ = pcops.knn(x, x, k)
            if not (torch.equal(i_tc, idx) and torch.equal(d_tc, d_ref)):
                raise SystemExit(f"tc differs from the exact path at B={B} N={N} D={D} k={k}")
            t_tc = time_fn(lambda: force("knn", "tc", x, x, k, None, None), dev, reps=reps)
        t_torch = time_fn(lambda: run_torch(x, k), dev, reps=reps)
        ti = run_torch(x, k)
        agree = (torch.sort(ti, -1)[0] == torch.sort(idx, -1)[0]).float().mean().item()
        t_p3d = t_cl = None
        if pytorch3d_ops is not None:
            try:
                t_p3d = time_fn(lambda: run_pytorch3d(x, k), dev, reps=reps)
            except Exception:
                pass
        if torch_cluster is not None:
            try:
                t_cl = time_fn(lambda: run_cluster(x, k, batch), dev, reps=reps)
            except Exception:
                pass
        best = min(t for t in (t_torch, t_p3d, t_cl) if t is not None)
        rows.append((B, N, D, k, fmt_ms(t_pcops), fmt_ms(t_tc), fmt_ms(t_torch), fmt_ms(t_p3d),
                     fmt_ms(t_cl), f"{t_torch / t_pcops:.2f}x", f"{best / t_pcops:.2f}x",
                     f"{agree:.4f}"))
    for line in environment_header():
        print(line)
    if dev == "cpu":
        print(f"load: {os.getloadavg()}")
    print_table(f"kNN in feature space, {dev}, float32, self-kNN (ms, median)",
                ["B", "N", "D", "k", "pcops", "tc", "torch", "pytorch3d", "cluster", "torch/pcops",
                 "best/pcops", "agree"], rows, args.out)


if __name__ == "__main__":
    main()
