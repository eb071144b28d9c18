"""Overhead of pcops.compat over the raw pcops ops it is built on.

    python benchmarks/bench_compat.py                 # GPU, PointNet++ shapes (B=16, N=4096)
    python benchmarks/bench_compat.py --quick         # CPU smoke run, small sizes
    python benchmarks/bench_compat.py --count         # dispatches per call (any device)
    python benchmarks/bench_compat.py --profile       # + CUDA kernels and their time per call

Each row times one compat call and the raw op(s) it wraps (the "raw" column names them), on
the same inputs handed over through zero-cost views only (a transpose view for channels-first
features, int64 indices already made). The difference is the shim: the int32 casts and padding
conversions the peer API demands, and the Python around them. Where the peer's contract makes
the output size depend on the data (torch_cluster's radius, fps with a batch vector), the raw side
includes the one host synchronisation that any implementation needs (radius: the nonzero of the
valid slots, or the neighbor_edges op the compat radius is built on; fps: one read of the
largest cloud). Times are medians of
`--reps` repetitions, each timing `--inner` back-to-back calls between two CUDA events
(perf_counter on the CPU) and dividing, so the host cost of a call is part of its time whenever
the GPU would otherwise wait for it. Target (issue 12): overhead < 10 % or < 10 us per call.
torch_cluster's calls marked * synchronise once (their output size depends on the data; torch_cluster
itself synchronises twice); fps with a batch vector also repacks the flat points into a padded
batch, a conversion the raw op does not do.
"""
import math
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pcops  # noqa: E402
from pcops.compat import pointnet2_ops as pu  # noqa: E402
from pcops.compat import pytorch3d as p3d  # noqa: E402
from pcops.compat import torch_cluster as tc  # noqa: E402
from common import base_parser, environment_header, print_table  # noqa: E402

ops = torch.ops.pcops


def time_us(fn, device, reps, inner, warmup=3):
    """Median microseconds per call over `reps` timings of `inner` back-to-back calls."""
    for _ in range(warmup):
        fn()
    cuda = str(device).startswith("cuda")
    times = []
    if cuda:
        torch.cuda.synchronize()
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) * 1e6 / inner)
    return statistics.median(times)


class _CountDispatches(TorchDispatchMode):
    """Counts the aten / pcops ops one call dispatches (what each costs the host: a few
    microseconds each on a GPU), split into views (no kernel) and the rest."""

    def __init__(self):
        super().__init__()
        self.views, self.ops, self.names = 0, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.ops += 1
            self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def count_dispatches(fn):
    """(ops that are not views, views, the names of the former) of one call of fn."""
    fn()
    with _CountDispatches() as c:
        fn()
    return c.ops, c.views, c.names


def cuda_kernels(fn, inner):
    """(kernels, GPU-busy us) per call of fn, from torch.profiler over `inner` calls."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels)  # us
    return len(kernels) / inner, busy / inner


def cases(B, N, M, S, C, device):
    g = torch.Generator().manual_seed(0)
    xyz = torch.rand(B, N, 3, generator=g).to(device)
    xyz_cf = xyz.transpose(1, 2).contiguous()          # what pointnet2_ops code holds
    feats_cf = torch.randn(B, C, N, generator=g).to(device)
    centres = xyz[:, :M].contiguous()
    fps64 = ops.furthest_point_sample(xyz, M)[0]
    fps32 = fps64.int()
    bq64 = ops.ball_query(centres, xyz, 0.2, S)[0].clamp(min=0)
    bq32 = bq64.int()
    nn_d2, nn_idx = ops.knn(xyz, centres, 3)
    nn_idx32 = nn_idx.int()                            # what pointnet2_ops's three_nn returns
    w = torch.rand(B, N, 3, generator=g).to(device)
    feats_m_cf = torch.randn(B, C, M, generator=g).to(device)
    lengths = torch.randint(N // 2, N + 1, (B,), generator=g).to(device)
    qg = pu.QueryAndGroup(0.2, S)
    flat = xyz.reshape(-1, 3)
    flat_batch = torch.arange(B, device=device).repeat_interleave(N)
    one = xyz[0]
    one_y = centres[0]

    def raw_query_and_group():
        idx = ops.ball_query(centres, xyz, 0.2, S)[0].clamp_(min=0)
        gx = (ops.group(xyz, idx) - centres.unsqueeze(2)).permute(0, 3, 1, 2)
        gf = ops.group(feats_cf.transpose(1, 2), idx).permute(0, 3, 1, 2)
        return torch.cat([gx, gf], 1)

    def raw_radius():
        # the COO output's size depends on the data: the least work that produces it is the
        # ball query, the valid-slot mask and one nonzero (its host synchronisation)
        idx, count = ops.ball_query(one_y.unsqueeze(0), one.unsqueeze(0), 0.2, S)
        return (torch.arange(S, device=device) < count[0].unsqueeze(1)).nonzero()

    def raw_radius_edges():
        # the raw ops the compat radius wraps: the ball query and the COO compaction op (its
        # one synchronisation)
        idx, count = ops.ball_query(one_y.unsqueeze(0), one.unsqueeze(0), 0.2, S)
        return ops.neighbor_edges(idx, N, count)

    def raw_fps_batch():
        # the output size (samples per cloud) and the FPS's shape (the largest cloud) depend on
        # the batch vector's values: the least any implementation of that contract does is read
        # the largest cloud once (its host synchronisation; torch_cluster's CUDA fps reads its
        # output size too), then launch the FPS on the clouds (here a view: they are of one size)
        left = torch.searchsorted(flat_batch, flat_batch)
        right = torch.searchsorted(flat_batch, flat_batch, right=True)
        L = int((right - left).max())
        return ops.furthest_point_sample(flat.view(-1, L, 3), math.ceil(L * M / N))

    return [
        # (library, compat call, compat fn, raw description, raw fn)
        ("pointnet2_ops", "furthest_point_sample", lambda: pu.furthest_point_sample(xyz, M),
         "furthest_point_sample", lambda: ops.furthest_point_sample(xyz, M)),
        ("pointnet2_ops", "gather_operation", lambda: pu.gather_operation(xyz_cf, fps32),
         "group", lambda: ops.group(xyz_cf.transpose(1, 2), fps64.unsqueeze(-1))),
        ("pointnet2_ops", "ball_query", lambda: pu.ball_query(0.2, S, xyz, centres),
         "ball_query", lambda: ops.ball_query(centres, xyz, 0.2, S)),
        ("pointnet2_ops", "grouping_operation", lambda: pu.grouping_operation(feats_cf, bq32),
         "group", lambda: ops.group(feats_cf.transpose(1, 2), bq64)),
        ("pointnet2_ops", "three_nn", lambda: pu.three_nn(xyz, centres),
         "knn k=3", lambda: ops.knn(xyz, centres, 3)),
        ("pointnet2_ops", "three_interpolate",
         lambda: pu.three_interpolate(feats_m_cf, nn_idx32, w),
         "interpolate", lambda: ops.interpolate(feats_m_cf.transpose(1, 2), nn_idx, w)),
        ("pointnet2_ops", "QueryAndGroup", lambda: qg(xyz, centres, feats_cf),
         "ball_query+2 group+cat", raw_query_and_group),
        ("pytorch3d", "sample_farthest_points", lambda: p3d.sample_farthest_points(xyz, K=M),
         "fps+group", lambda: ops.group(xyz, ops.furthest_point_sample(xyz, M)[0].unsqueeze(-1))),
        ("pytorch3d", "knn_points", lambda: p3d.knn_points(centres, xyz, K=S),
         "knn", lambda: ops.knn(centres, xyz, S)),
        ("pytorch3d", "knn_points lengths2", lambda: p3d.knn_points(centres, xyz, lengths2=lengths, K=S),
         "knn lengths", lambda: ops.knn(centres, xyz, S, None, lengths)),
        ("pytorch3d", "knn_gather", lambda: p3d.knn_gather(xyz, bq64),
         "group", lambda: ops.group(xyz, bq64)),
        ("pytorch3d", "ball_query", lambda: p3d.ball_query(centres, xyz, K=S, radius=0.2),
         "ball_query+group", lambda: ops.group(xyz, ops.ball_query(centres, xyz, 0.2, S)[0])),
        ("torch_cluster", "fps (one cloud)", lambda: tc.fps(one, None, M / N, False),
         "furthest_point_sample", lambda: ops.furthest_point_sample(one.unsqueeze(0), M)),
        ("torch_cluster", "knn (one cloud)", lambda: tc.knn(one, one_y, S),
         "knn", lambda: ops.knn(one_y.unsqueeze(0), one.unsqueeze(0), S)),
        ("torch_cluster", "radius (one cloud)*", lambda: tc.radius(one, one_y, 0.2, max_num_neighbors=S),
         "ball_query+nonzero", raw_radius),
        ("torch_cluster", "radius (one cloud)*", lambda: tc.radius(one, one_y, 0.2, max_num_neighbors=S),
         "ball_query+neighbor_edges", raw_radius_edges),
        ("torch_cluster", "fps (batch vector)*", lambda: tc.fps(flat, flat_batch, M / N, False),
         "cloud size+sync+fps", raw_fps_batch),
    ]


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--points", type=int, default=4096)
    p.add_argument("--centres", type=int, default=1024)
    p.add_argument("--nsample", type=int, default=32)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--count", action="store_true",
                   help="also count the dispatches of one call (views apart) on each side")
    p.add_argument("--profile", action="store_true",
                   help="with --count on CUDA: also the kernels and GPU-busy us per call")
    p.add_argument("--names", action="store_true", help="with --count: print the compat ops")
    args = p.parse_args()
    if args.quick:
        args.batch, args.points, args.centres, args.nsample, args.channels = 2, 512, 128, 16, 16
        args.reps, args.inner = 5, 2
    dev = args.device
    rows = []
    for lib, name, fn, raw_name, raw in cases(args.batch, args.points, args.centres, args.nsample,
                                              args.channels, dev):
        t_raw = time_us(raw, dev, args.reps, args.inner)
        t_compat = time_us(fn, dev, args.reps, args.inner)
        extra = t_compat - t_raw
        ok = extra < 10.0 or extra < 0.10 * t_raw
        row = [lib, name, raw_name, f"{t_raw:.1f}", f"{t_compat:.1f}", f"{extra:+.1f}",
               f"{100 * extra / t_raw:+.1f}%", "ok" if ok else "OVER"]
        if args.count:
            (co, cv, names), (ro, rv, _) = count_dispatches(fn), count_dispatches(raw)
            row += [f"{ro}+{rv}v", f"{co}+{cv}v"]
            if args.names:
                print(f"{lib} {name}: {' '.join(names)}")
            if args.profile and str(dev).startswith("cuda"):
                (ck, cb), (rk, rb) = cuda_kernels(fn, args.inner), cuda_kernels(raw, args.inner)
                row += [f"{rk:.0f} / {rb:.1f}", f"{ck:.0f} / {cb:.1f}"]
        rows.append(row)
    print("\n".join(environment_header()))
    print(f"B={args.batch} N={args.points} M={args.centres} S={args.nsample} C={args.channels}, "
          f"device {dev}, medians of {args.reps} x {args.inner} calls (us per call)")
    header = ["library", "compat call", "raw", "raw us", "compat us", "extra us", "extra",
              "< 10% or < 10 us"]
    if args.count:
        header += ["raw ops", "compat ops"]
        if args.profile and str(dev).startswith("cuda"):
            header += ["raw kernels / GPU us", "compat kernels / GPU us"]
    print_table("pcops.compat overhead over the raw ops", header, rows, file=args.out)
    if args.count:
        print("ops: dispatches of one call that are not views, + views (v), counted with a "
              "TorchDispatchMode" + ("; kernels / GPU us: torch.profiler, per call"
                                     if args.profile else ""))


if __name__ == "__main__":
    main()
