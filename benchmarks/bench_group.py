"""Benchmark of pcops.group (forward) and pcops.group_backward against plain PyTorch and the
peer libraries that are installed, on the PointNet++ shapes and a sweep over channels.

    python benchmarks/bench_group.py                # CUDA if available, else CPU
    python benchmarks/bench_group.py --device cpu --quick

Shapes: B batch, N points, M groups, S neighbours, C channels (features [B,N,C], idx [B,M,S]).
Plain PyTorch is written as a user would: `features.gather` with a mask for the -1 slots
(forward) and `index_add_` into a padded [B*N+1, C] buffer (backward; atomics on CUDA, so not
deterministic) -- and index_add_ again under torch.use_deterministic_algorithms (the
deterministic PyTorch a user would have to turn on to match our guarantee).

The floor (CUDA): the fewest bytes moved -- idx read once, the gathered rows written once
(forward) or read once (backward), the features read (forward) or written (backward) once --
over ~3.0 TB/s of H100 memory bandwidth; GB/s is those bytes over the measured time.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the worktree's pcops, when run as a script

from common import base_parser, environment_header, fmt_ms, print_table, time_fn, try_import  # noqa: E402

import pcops  # noqa: E402



HBM_BYTES_PER_S = 3.0e12  # H100 SXM, about; METHOD.md: the floor is bytes over this

# name, B, N, M, S, C
POINTNET2_SHAPES = [
    ("SA1 xyz", 32, 1024, 512, 32, 3),
    ("SA1 xyz+normals", 32, 1024, 512, 32, 6),
    ("SA2 (128+3)", 32, 512, 128, 64, 131),
    ("MSG SA1 r0.4", 32, 1024, 512, 128, 3),
]
CHANNEL_SWEEP = [("sweep C", 32, 1024, 512, 32, c) for c in (16, 64, 128, 256)]
QUICK_SHAPES = [("quick", 2, 256, 64, 16, 3), ("quick", 2, 256, 64, 16, 64)]


def make_idx(B, N, M, S, gen, device):
    """Ball-query-like indices: a random count of neighbours per group, the empty slots
    repeating the first one, and a few groups with none (-1)."""
    idx = torch.randint(0, N, (B, M, S), generator=gen)
    count = torch.randint(1, S + 1, (B, M, 1), generator=gen)
    slot = torch.arange(S)
    idx = torch.where(slot < count, idx, idx[:, :, :1])
    idx[torch.rand(B, M, generator=gen) < 0.02] = -1
    return idx.to(device)


# plain PyTorch, as a user would write it ------------------------------------------------------


def torch_group(features, idx):
    B, N, C = features.shape
    _, M, S = idx.shape
    rows = idx.clamp(min=0).reshape(B, M * S, 1).expand(B, M * S, C)
    out = features.gather(1, rows).view(B, M, S, C)
    return out.masked_fill((idx < 0)[..., None], 0)


def torch_group_backward(grad_out, idx, N):
    B, M, S, C = grad_out.shape
    flat = idx + (torch.arange(B, device=idx.device) * N)[:, None, None]
    flat = torch.where(idx < 0, torch.full_like(idx, B * N), flat)  # -1 slots go to a dummy row
    out = grad_out.new_zeros(B * N + 1, C)
    out.index_add_(0, flat.view(-1), grad_out.reshape(-1, C))
    return out[: B * N].view(B, N, C)


def deterministic(fn):
    def run(*args):
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return fn(*args)
        finally:
            torch.use_deterministic_algorithms(old)

    return run


# peers (forward only; each in its own layout, converted outside the timed region) -----------


def peer_forward_fns(features, idx):
    fns = {}
    p2 = try_import("pointnet2_ops.pointnet2_utils")
    if p2 is not None and features.is_cuda and features.dtype == torch.float32:
        f, i = features.transpose(1, 2).contiguous(), idx.clamp(min=0).int().contiguous()
        fns["pointnet2_ops"] = lambda: p2.grouping_operation(f, i)  # [B,C,M,S]; no -1 support
    mmcv_ops = try_import("mmcv.ops")
    if mmcv_ops is not None and features.is_cuda and hasattr(mmcv_ops, "grouping_operation"):
        f, i = features.transpose(1, 2).contiguous(), idx.clamp(min=0).int().contiguous()
        fns["mmcv"] = lambda: mmcv_ops.grouping_operation(f, i)
    p3d = try_import("pytorch3d.ops.utils")
    if p3d is not None and hasattr(p3d, "masked_gather"):
        fns["pytorch3d"] = lambda: p3d.masked_gather(features, idx)
    return fns


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch and OpenMP)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the same libgomp runs the pcops kernels
    device = args.device
    on_cuda = device.startswith("cuda")
    reps = 3 if args.quick else (50 if on_cuda else 5)
    warmup = 1 if args.quick else 3
    shapes = QUICK_SHAPES if args.quick else POINTNET2_SHAPES + CHANNEL_SWEEP
    gen = torch.Generator().manual_seed(0)

    print("\n".join(environment_header()))
    fwd_rows, bwd_rows = [], []
    peer_names = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        es = torch.empty((), dtype=dtype).element_size()
        for name, B, N, M, S, C in shapes:
            features = torch.randn(B, N, C, generator=gen).to(dtype).to(device)
            idx = make_idx(B, N, M, S, gen, device)
            grad_out = torch.randn(B, M, S, C, generator=gen).to(dtype).to(device)
            shape = f"{name} B{B} N{N} M{M} S{S} C{C}"

            # forward
            t_pcops = time_fn(lambda: pcops.group(features, idx), device, warmup=warmup, reps=reps)
            t_torch = time_fn(lambda: torch_group(features, idx), device, warmup=warmup, reps=reps)
            peers = {k: time_fn(fn, device, warmup=warmup, reps=reps)
                     for k, fn in peer_forward_fns(features, idx).items()}
            for k in peers:
                if k not in peer_names:
                    peer_names.append(k)
            floor_bytes = B * M * S * 8 + B * N * C * es + B * M * S * C * es
            fwd_rows.append((shape, dtype_name, t_pcops, t_torch, peers, floor_bytes))

            # backward
            t_pcops = time_fn(lambda: pcops.group_backward(grad_out, idx, N), device, warmup=warmup, reps=reps)
            t_torch = time_fn(lambda: torch_group_backward(grad_out, idx, N), device, warmup=warmup, reps=reps)
            try:
                t_det = time_fn(lambda: deterministic(torch_group_backward)(grad_out, idx, N), device,
                                warmup=warmup, reps=reps)
            except RuntimeError:  # no deterministic index_add_ for this device/dtype
                t_det = None
            floor_bytes = B * M * S * 8 + B * M * S * C * es + B * N * C * es
            bwd_rows.append((shape, dtype_name, t_pcops, t_torch, t_det, floor_bytes))

    def floor_cols(t, floor_bytes):
        gbs = floor_bytes / (t * 1e-3) / 1e9
        cols = [f"{gbs:.0f}" if gbs >= 10 else f"{gbs:.2g}"]
        if on_cuda:
            cols.append(fmt_ms(floor_bytes / HBM_BYTES_PER_S * 1e3))
        return cols

    extra = ["floor ms"] if on_cuda else []
    header = ["shape", "dtype", "pcops ms", "torch gather ms", *[f"{p} ms" for p in peer_names],
              "speedup vs torch", "pcops GB/s", *extra]
    rows = []
    for shape, dt, tp, tt, peers, fb in fwd_rows:
        rows.append([shape, dt, fmt_ms(tp), fmt_ms(tt), *[fmt_ms(peers.get(p)) for p in peer_names],
                     f"{tt / tp:.2f}x", *floor_cols(tp, fb)])
    print_table(f"group forward on {device}", header, rows, args.out)

    header = ["shape", "dtype", "pcops ms", "torch index_add_ ms", "torch deterministic ms",
              "speedup vs index_add_", "speedup vs deterministic", "pcops GB/s", *extra]
    rows = []
    for shape, dt, tp, tt, td, fb in bwd_rows:
        rows.append([shape, dt, fmt_ms(tp), fmt_ms(tt), fmt_ms(td), f"{tt / tp:.2f}x",
                     f"{td / tp:.2f}x" if td else "-", *floor_cols(tp, fb)])
    print_table(f"group_backward on {device} (pcops: deterministic, no atomics)", header, rows, args.out)


if __name__ == "__main__":
    main()
