"""Benchmark of pcops.ball_query against a plain PyTorch ball query and the peer libraries that
are installed, on the PointNet++ shapes and large clouds.

    python benchmarks/bench_ball_query.py                # CUDA if available, else CPU
    python benchmarks/bench_ball_query.py --device cpu --quick

Shapes: B batch, M queries (the FPS centres: here the first M points of each cloud), N points,
S = nsample, r = radius. Clouds are uniform in [-1, 1)^3 (ModelNet shapes are normalised to the
unit sphere), the large ones in [0, 1)^3.

Plain PyTorch is what a user writes: squared distances by torch.cdist, a mask d < r**2, the
first S indices of the mask by topk over (index if inside else N), padding with the first.
It materialises B*M*N distances, so it runs out of memory long before pcops does.

Reference numbers (CUDA): the floor is the fewest bytes moved (query, ref, idx and count once)
over ~3.0 TB/s; "all pairs" is the time to evaluate all B*M*N distances (8 flops each, no FMA)
at the H100's ~33.5 T non-FMA FP32 instructions/s: the early exit should beat it when balls
are dense, and the scan cannot beat it when they are empty.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the worktree's pcops, when run as a script

from common import base_parser, environment_header, fmt_ms, print_table, time_fn, try_import  # noqa: E402

import pcops  # noqa: E402



HBM_BYTES_PER_S = 3.0e12
FP32_OPS_PER_S = 33.5e12  # H100 SXM: 67 TFLOPS counts an FMA as two; distances use none

# name, B, M, N, S, radius, cube (0: [-1,1)^3, 1: [0,1)^3)
POINTNET2_SHAPES = [
    ("SSG SA1", 32, 512, 1024, 32, 0.2, 0),
    ("SSG SA2", 32, 128, 512, 64, 0.4, 0),
    ("MSG SA1 r0.1", 32, 512, 1024, 16, 0.1, 0),
    ("MSG SA1 r0.4", 32, 512, 1024, 128, 0.4, 0),
    ("MSG SA2 r0.8", 32, 128, 512, 128, 0.8, 0),
]
LARGE_SHAPES_CUDA = [
    ("large", 4, 4096, 16384, 64, 0.1, 1),
    ("large", 1, 4096, 100000, 32, 0.05, 1),
    ("large sparse", 1, 4096, 100000, 32, 0.005, 1),
    ("large", 1, 16384, 1000000, 32, 0.02, 1),
]
LARGE_SHAPES_CPU = [
    ("large", 4, 1024, 16384, 64, 0.1, 1),
    ("large", 1, 1024, 50000, 32, 0.05, 1),
    ("large sparse", 1, 1024, 50000, 32, 0.005, 1),
]
QUICK_SHAPES = [("quick", 2, 64, 256, 16, 0.3, 0), ("quick", 1, 128, 2000, 32, 0.1, 1)]


def torch_ball_query(query, ref, radius, nsample):
    N = ref.shape[1]
    inside = torch.cdist(query, ref).square() < radius * radius  # [B, M, N]
    key = torch.where(inside, torch.arange(N, device=ref.device), N)
    first = key.topk(min(nsample, N), dim=-1, largest=False, sorted=True).values
    if nsample > N:
        first = torch.cat([first, first.new_full(first.shape[:-1] + (nsample - N,), N)], dim=-1)
    first = torch.where(first == N, first[..., :1], first)  # pad with the first neighbour
    return torch.where(first == N, -1, first)  # no neighbour at all


def peer_fns(query, ref, radius, nsample):
    fns = {}
    p3d = try_import("pytorch3d.ops")
    if p3d is not None and hasattr(p3d, "ball_query"):
        fns["pytorch3d"] = lambda: p3d.ball_query(query, ref, K=nsample, radius=radius, return_nn=False)
    if query.is_cuda and query.dtype == torch.float32:
        p2 = try_import("pointnet2_ops.pointnet2_utils")
        if p2 is not None:
            fns["pointnet2_ops"] = lambda: p2.ball_query(radius, nsample, ref, query)
        mmcv_ops = try_import("mmcv.ops")
        if mmcv_ops is not None and hasattr(mmcv_ops, "ball_query"):
            fns["mmcv"] = lambda: mmcv_ops.ball_query(0.0, radius, nsample, ref, query)
    return fns


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch and OpenMP)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the same libgomp runs the pcops kernels
    device = args.device
    on_cuda = device.startswith("cuda")
    reps = 3 if args.quick else (30 if on_cuda else 5)
    warmup = 1 if args.quick else 2
    if args.quick:
        shapes = QUICK_SHAPES
    else:
        shapes = POINTNET2_SHAPES + (LARGE_SHAPES_CUDA if on_cuda else LARGE_SHAPES_CPU)
    gen = torch.Generator().manual_seed(0)

    print("\n".join(environment_header()))
    rows, peer_names = [], []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for name, B, M, N, S, radius, cube in shapes:
            ref = torch.rand(B, N, 3, generator=gen, dtype=torch.float64)
            ref = (ref if cube else ref * 2 - 1).to(dtype).to(device)
            query = ref[:, :M].contiguous()
            idx, count = pcops.ball_query(query, ref, radius, S, return_count=True)
            mean_count = count.double().mean().item()
            t_pcops = time_fn(lambda: pcops.ball_query(query, ref, radius, S), device, warmup=warmup, reps=reps)
            try:
                t_torch = time_fn(lambda: torch_ball_query(query, ref, radius, S), device, warmup=warmup,
                                  reps=reps)
            except torch.OutOfMemoryError:
                t_torch = None
            if on_cuda:
                torch.cuda.empty_cache()
            peers = {}
            for k, fn in peer_fns(query, ref, radius, S).items():
                try:
                    peers[k] = time_fn(fn, device, warmup=warmup, reps=reps)
                except Exception as e:  # a peer that fails on this shape: say so, keep going
                    print(f"{k} failed on {name}: {type(e).__name__}: {e}")
                if k not in peer_names:
                    peer_names.append(k)
            es = torch.empty((), dtype=dtype).element_size()
            floor_bytes = (B * M * 3 + B * N * 3) * es + B * M * S * 8 + B * M * 8
            rows.append((f"{name} B{B} M{M} N{N} S{S} r{radius}", dtype_name, mean_count, t_pcops, t_torch,
                         peers, floor_bytes, B * M * N * 8))

    extra = ["floor ms", "all pairs ms"] if on_cuda else []
    header = ["shape", "dtype", "mean count", "pcops ms", "torch ms", *[f"{p} ms" for p in peer_names],
              "speedup vs torch", *extra]
    table = []
    for shape, dt, mc, tp, tt, peers, fb, flops in rows:
        cols = [shape, dt, f"{mc:.1f}", fmt_ms(tp), fmt_ms(tt) if tt else "OOM",
                *[fmt_ms(peers.get(p)) for p in peer_names], f"{tt / tp:.1f}x" if tt else "-"]
        if on_cuda:
            cols += [fmt_ms(fb / HBM_BYTES_PER_S * 1e3), fmt_ms(flops / FP32_OPS_PER_S * 1e3)]
        table.append(cols)
    print_table(f"ball_query on {device}", header, table, args.out)


if __name__ == "__main__":
    main()
