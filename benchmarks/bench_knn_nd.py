"""Benchmark of pcops.knn in feature space (D != 3) against the plain-torch kNN of DGCNN and the
peer libraries: the sizes of issue 36 (B = 32, N = 1024, k = 20, D = 64 / 128 / 256; N = 4096).

    python benchmarks/bench_knn_nd.py --device cuda
    python benchmarks/bench_knn_nd.py --device cpu
    python benchmarks/bench_knn_nd.py --device cpu --quick     # smoke run
    python benchmarks/bench_knn_nd.py --device cpu --threads 2 # torch and pcops on 2 threads
    python benchmarks/bench_knn_nd.py --device cuda --sweep    # brute vs tc vs torch over D, N, k

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
A peer that is not installed or refuses a size shows "-" (--peerbench DIR loads PyTorch3D's and
torch_cluster's kernels from the peer benchmark's builds instead). "torch/pcops" is the
plain-torch time over pcops's, "best/pcops" the best contender's. On CUDA every call starts with
L2 flushed. --threads sets torch.set_num_threads, which pcops's OpenMP regions share (one libgomp
in the process). "agree" is, per contender, the fraction of pcops's neighbour indices that it
also returns (the torch baseline's measures its inexactness).
"""
import importlib.util
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
PEERS = {}  # the peer benchmark's builds (--peerbench): name -> module


def load_peerbench(folder):
    """PyTorch3D's and torch_cluster's CUDA kNN from the peer benchmark's builds (its
    built/<peer>/*.so, made by its build_one.py), where the libraries are not installed."""
    sys.path.insert(0, folder)
    import build_one  # the peer benchmark's builder: names and paths of its modules
    for peer in ("pytorch3d", "torch_cluster"):
        path = build_one.module_path(os.path.join(folder, "built"), peer)
        if not os.path.isfile(path):
            print(f"peer {peer}: not built ({path})")
            continue
        spec = importlib.util.spec_from_file_location(build_one.peer_specs()[peer]["module"], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        PEERS[peer] = mod


def run_torch(x, k):
    inner = torch.matmul(x, x.transpose(1, 2))
    sq = (x * x).sum(-1, keepdim=True)
    neg = 2 * inner - sq - sq.transpose(1, 2)
    return neg.topk(k, dim=-1)[1]


def run_pytorch3d(x, k):
    if "pytorch3d" in PEERS:  # KNearestNeighborIdxCuda: idx, dists (sorted for this K), L2
        B, N = x.shape[:2]
        lengths = torch.full((B,), N, dtype=torch.int64, device=x.device)
        return PEERS["pytorch3d"].knn_idx(x, x, lengths, lengths, 2, k, -1)[0]
    return pytorch3d_ops.knn_points(x, x, K=k).idx


def run_cluster(x, k, batch):
    flat = x.reshape(-1, x.shape[-1])
    if "torch_cluster" in PEERS:  # torch_cluster's knn kernel: [2, B N k] (query, ref) pairs
        B, N = x.shape[:2]
        ptr = torch.arange(0, B * N + 1, N, dtype=torch.int64, device=x.device)
        pairs = PEERS["torch_cluster"].knn(flat, flat, ptr, ptr, k, False)
        return pairs[1].view(B, N, k) - (torch.arange(B, device=x.device) * N).view(B, 1, 1)
    return torch_cluster.knn(flat, flat, k, batch, batch)


def sweep(args):
    """The forced paths brute and tc and DGCNN's matmul + topk on self-kNN of standard normal
    features over D, N and k (and one cloud far from the origin); tc checked equal to the brute
    force on every row. What AUTO's tc_min_d (kernels/knn_nd.cu) is read from."""
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    sizes = [(32, 1024, D, 20) for D in (16, 24, 32, 48, 64, 128, 256, 512)]
    sizes += [(32, 1024, 64, 1), (32, 1024, 64, 64), (8, 256, 16, 20), (8, 256, 64, 20),
              (2, 128, 32, 10), (1, 64, 16, 4), (32, 4096, 64, 20), (32, 4096, 16, 20),
              (4, 8192, 128, 16), (1, 20000, 32, 16)]
    rows = []
    for offset, group in ((0.0, sizes), (30.0, [(32, 1024, 64, 20)])):
        for B, N, D, k in group:
            g = torch.Generator().manual_seed(0)
            x = (torch.randn(B, N, D, generator=g) + offset).cuda()
            paths = {name: (lambda name=name: force("knn", name, x, x, k, None, None))
                     for name in ("brute", "tc")}
            (db, ib), (dt, it) = paths["brute"](), paths["tc"]()
            if not (torch.equal(db, dt) and torch.equal(ib, it)):
                raise SystemExit(f"tc differs from the brute force at B={B} N={N} D={D} k={k}")
            reps = 5 if B * N * N * D > 1e11 else 15
            tb, tt, th = (time_fn(fn, "cuda", reps=reps, flush=flush)
                          for fn in (paths["brute"], paths["tc"], lambda: run_torch(x, k)))
            rows.append((B, N, D, k, offset, fmt_ms(tb), fmt_ms(tt), fmt_ms(th),
                         f"{tb / tt:.2f}x", f"{th / tt:.2f}x"))
    for line in environment_header():
        print(line)
    print_table("kNN in feature space, cuda, float32, self-kNN, forced paths (ms, median)",
                ["B", "N", "D", "k", "offset", "brute", "tc", "torch", "brute/tc", "torch/tc"],
                rows, args.out)


def main():
    p = base_parser(__doc__)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--peerbench", default=None,
                   help="the peer benchmark's folder: its PyTorch3D and torch_cluster builds")
    p.add_argument("--sweep", action="store_true",
                   help="CUDA: pcops's paths (brute, tc) and the matmul + topk over D, N, k")
    args = p.parse_args()
    if args.peerbench:
        load_peerbench(os.path.abspath(args.peerbench))
    if args.sweep:
        return sweep(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    sizes = [(32, 1024, 64, 20), (32, 1024, 128, 20), (32, 1024, 256, 20), (32, 4096, 64, 20)]
    if args.quick:
        sizes = [(4, 256, 64, 20)]
    reps = 3 if args.quick or dev == "cpu" else 30
    # CUDA: a 256 MB buffer zeroed before each timed call, so every call starts with L2 cold
    flush = torch.empty(64 << 20, dtype=torch.float32, device=dev) if dev == "cuda" else None

    def timed(fn):
        return time_fn(fn, dev, reps=reps, flush=flush)

    def agreement(other):  # the fraction of pcops's neighbours (as sets per query) `other` has
        return (torch.sort(other, -1)[0] == torch.sort(idx, -1)[0]).float().mean().item()

    rows = []
    for B, N, D, k in sizes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, N, D, generator=g).to(dev)
        batch = torch.arange(B, device=dev).repeat_interleave(N)
        dist, idx = pcops.knn(x, x, k)
        t_pcops = timed(lambda: pcops.knn(x, x, k))
        t_tc = None
        if dev == "cuda" and torch.cuda.get_device_capability()[0] >= 8:
            d_tc, i_tc = force("knn", "tc", x, x, k, None, None)
            d_br, i_br = force("knn", "brute", x, x, k, None, None)
            for name, (d, i) in (("tc", (d_tc, i_tc)), ("brute", (d_br, i_br))):
                if not (torch.equal(i, idx) and torch.equal(d, dist)):
                    raise SystemExit(f"{name} differs from pcops.knn at B={B} N={N} D={D} k={k}")
            t_tc = timed(lambda: force("knn", "tc", x, x, k, None, None))
        t_torch = timed(lambda: run_torch(x, k))
        agree = [f"torch {agreement(run_torch(x, k)):.4f}"]
        t_p3d = t_cl = None
        if pytorch3d_ops is not None or "pytorch3d" in PEERS:
            try:
                agree.append(f"p3d {agreement(run_pytorch3d(x, k)):.4f}")
                t_p3d = timed(lambda: run_pytorch3d(x, k))
            except Exception as e:  # noqa: BLE001
                print(f"pytorch3d at B={B} N={N} D={D} k={k}: {type(e).__name__}: {e}")
        if torch_cluster is not None or "torch_cluster" in PEERS:
            try:
                agree.append(f"cluster {agreement(run_cluster(x, k, batch)):.4f}")
                t_cl = timed(lambda: run_cluster(x, k, batch))
            except Exception as e:  # noqa: BLE001
                print(f"torch_cluster at B={B} N={N} D={D} k={k}: {type(e).__name__}: {e}")
        best = min(t for t in (t_torch, t_p3d, t_cl) if t is not None)
        rows.append((B, N, D, k, fmt_ms(t_pcops), fmt_ms(t_tc), fmt_ms(t_torch), fmt_ms(t_p3d),
                     fmt_ms(t_cl), f"{t_torch / t_pcops:.2f}x", f"{best / t_pcops:.2f}x",
                     ", ".join(agree)))
    for line in environment_header():
        print(line)
    if dev == "cpu":
        print(f"load: {os.getloadavg()}")
    print_table(f"kNN in feature space, {dev}, float32, self-kNN (ms, median)",
                ["B", "N", "D", "k", "pcops", "tc", "torch", "pytorch3d", "cluster", "torch/pcops",
                 "best/pcops", "agree"], rows, args.out)


if __name__ == "__main__":
    main()
