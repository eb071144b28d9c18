"""Benchmark of circle NMS: pcops against what users run today.

    python benchmarks/bench_circle_nms.py [--device cuda|cpu] [--quick] [--out FILE]
    python benchmarks/bench_circle_nms.py --device cuda --peer [--sizes 1000,4096,16384,65536]

--peer times what ../shared/peerbench times for rows C1-C4 (issue 9): centres uniform in a
100 m x 100 m square (seed 1000 + N), radius 1.0, strictly descending scores; each repetition
zeroes a 256 MB buffer (L2 flush), synchronises, then takes the host clock around one call
followed by a synchronisation ("host", the peer benchmark's number) or a CUDA event pair around
the call ("event"); median of 50. Rows: circle_nms, circle_nms_mask, and each CUDA path forced
through the internal op (block and flow: N <= 4096; grid), with the issue's targets. "kernel ms" is the GPU time of the call's kernels and copies (torch.profiler,
mean of 20 back-to-back calls, L2 warm): what is left of "host ms" is launch and host overhead.

Inputs look like CenterPoint's pre-NMS detections: N boxes around N/8 objects in a 102.4 m
square (nuScenes range), 8 boxes per object jittered by 0.3 m, random scores; groups = 10 class
ids when enabled; radius 2 m (CenterPoint's car threshold 4 = 2**2). Sizes: 1k, 4k (CenterPoint's
pre-NMS top-k), 10k, 30k.

Columns (milliseconds, median):
  pcops          pcops.circle_nms on --device (one host synchronisation, for K)
  pcops_mask     pcops.circle_nms_mask on --device (no synchronisation)
  numpy_host     CenterPoint / mmdetection3d's algorithm in plain NumPy on the host: what the
                 peers do (their numba loop runs on the host too); includes the copy to the host
  torch_matrix   plain PyTorch as a user would write it on --device: the N x N suppression matrix
                 (pairwise distances < r**2, same group, later in score order), copied to the
                 host, then the greedy loop over its rows in NumPy
  mmdet3d        mmdetection3d's numba circle_nms, when importable (it runs on the host)
  speedup        fastest baseline / pcops
On CUDA, `floor` is the least time the mask allows: the larger of its upper triangle (N**2/16
bytes) written once and read once over 3.0 TB/s, and the N**2/2 pair tests (5 flops each) over
60 TFLOPS; the scan's C = N/64 dependent steps are not in it, and at these sizes they dominate.
`mask GB/s` is those bytes over the pcops_mask time.
"""
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # benchmarks/ (common) and the checkout (pcops)
from common import base_parser, environment_header, fmt_ms, print_table, time_fn, try_import  # noqa: E402

import pcops  # noqa: E402

RADIUS = 2.0
H100_BYTES_PER_S = 3.0e12
H100_FP32_FLOPS = 60e12  # FP32 without the tensor cores (SXM datasheet: 67 TFLOPS)


def centerpoint_like(N, gen, n_groups=0):
    """Centres [N, 3], scores [N], groups [N] or None, on the CPU."""
    objects = torch.rand(max(N // 8, 1), 2, generator=gen, dtype=torch.float64) * 102.4 - 51.2
    which = torch.randint(0, len(objects), (N,), generator=gen)
    xy = objects[which] + torch.randn(N, 2, generator=gen, dtype=torch.float64) * 0.3
    z = torch.rand(N, 1, generator=gen, dtype=torch.float64) * 3
    centers = torch.cat([xy, z], 1).float()
    scores = torch.rand(N, generator=gen)
    groups = torch.randint(0, n_groups, (N,), generator=gen) if n_groups else None
    return centers, scores, groups


def numpy_host(centers, scores, radius, groups=None):
    """CenterPoint's greedy loop, its inner loop vectorised with NumPy, on the host."""
    xy = centers[:, :2].cpu().numpy()
    s = scores.cpu().numpy()
    g = None if groups is None else groups.cpu().numpy()
    order = np.argsort(-s, kind="stable")
    suppressed = np.zeros(len(s), dtype=bool)
    keep = []
    r2 = radius * radius
    for a, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        later = order[a + 1:]
        d = ((xy[later] - xy[i]) ** 2).sum(1)
        hit = d < r2
        if g is not None:
            hit &= g[later] == g[i]
        suppressed[later[hit]] = True
    return keep


def torch_matrix(centers, scores, radius, groups=None):
    """The suppression matrix in plain PyTorch on the input's device (in row chunks, to bound
    the memory), then the greedy loop over its rows on the host."""
    order = torch.sort(scores, stable=True, descending=True).indices
    xy = centers[order, :2]
    g = None if groups is None else groups[order]
    N = len(xy)
    rows = []
    for r0 in range(0, N, 4096):
        d = ((xy[r0:r0 + 4096, None, :] - xy[None, :, :]) ** 2).sum(-1)
        m = d < radius * radius
        if g is not None:
            m &= g[r0:r0 + 4096, None] == g[None, :]
        rows.append(torch.triu(m, diagonal=r0 + 1))  # only later boxes: global column > row
    adj = torch.cat(rows).cpu().numpy()
    removed = np.zeros(N, dtype=bool)
    keep = []
    for i in range(N):
        if not removed[i]:
            keep.append(i)
            removed |= adj[i]
    return order.cpu()[keep]


def time_checked(fn, expected, reps, name, warmup):
    """Median wall-clock milliseconds of fn() (the device synchronised around each call),
    checking that its kept indices are `expected`."""
    times = []
    for _ in range(warmup):
        fn()
    for _ in range(reps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        assert [int(i) for i in out] == expected, f"{name} keeps other boxes than pcops"
    return statistics.median(times)


def mmdet3d_fn():
    mod = try_import("mmdet3d.models.layers.box3d_nms")
    if mod is None or not hasattr(mod, "circle_nms"):
        return None

    def run(centers, scores, radius, groups=None):
        dets = torch.cat([centers[:, :2], scores[:, None]], 1).cpu().numpy()
        if groups is None:
            return mod.circle_nms(dets, radius * radius, post_max_size=len(dets))
        keep = []
        g = groups.cpu().numpy()
        for v in np.unique(g):  # their heads run one NMS per task / class
            sel = np.flatnonzero(g == v)
            keep += [sel[k] for k in mod.circle_nms(dets[sel], radius * radius, post_max_size=len(sel))]
        return sorted(keep, key=lambda i: (-dets[i, 2], i))  # merged in score order

    run(torch.rand(64, 2), torch.rand(64), 0.1)  # numba compiles on the first call

    return run


PEER_TARGETS_MS = {1000: 0.03, 4096: 0.08, 16384: 0.40, 65536: 2.5}  # issue 9, rows C1-C4


def peer_inputs(n, device):
    """The peer benchmark's NMS inputs (peerbench/bench.py nms_inputs)."""
    g = torch.Generator().manual_seed(1000 + n)
    centres = torch.rand(n, 2, generator=g, dtype=torch.float32) * 100.0
    scores = (torch.arange(n, 0, -1, dtype=torch.float64) / n).to(torch.float32)
    return centres.to(device), scores.to(device)


def peer_time(fn, flush, mode, reps=50, warmup=12):
    """Median ms of one call: L2 flushed, synchronised, then host clock (call + sync) or events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        if mode == "event":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_time(fn, reps=20):
    """Mean ms of GPU work (kernels, copies, memsets) per call, from torch.profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us = 0.0
    for e in prof.key_averages():
        us += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    return us / reps / 1e3


def peer_main(args):
    from pcops._paths import force

    device = args.device
    assert device.startswith("cuda"), "--peer times the CUDA ops"
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else sorted(PEER_TARGETS_MS)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device)
    header = ["N", "K kept", "what", "host ms", "event ms", "kernel ms", "target ms", "met"]
    rows = []
    for n in sizes:
        c, s = peer_inputs(n, device)
        keep = pcops.circle_nms(c, s, 1.0)
        mask = pcops.circle_nms_mask(c, s, 1.0)
        paths = {"circle_nms": lambda: pcops.circle_nms(c, s, 1.0),
                 "circle_nms_mask": lambda: pcops.circle_nms_mask(c, s, 1.0)}
        for path in ("block", "flow", "grid"):
            if path != "grid" and n > 4096:
                continue
            name = f"{path} path (forced)"
            out = force("circle_nms", path, c, s, 1.0, None)
            assert torch.equal(out[0], mask) and torch.equal(out[1][:len(keep)], keep), name
            paths[name] = (lambda p: lambda: force("circle_nms", p, c, s, 1.0, None))(path)
        assert torch.equal(torch.nonzero(mask).flatten(), keep.sort().values)
        # the same boxes in a random order: the peers' inputs come sorted by score (and the
        # single-block kernel then skips its sort); this row pays for the sort
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(n)).to(device)
        c_shuffled, s_shuffled = c[perm], s[perm]
        assert torch.equal(perm[pcops.circle_nms(c_shuffled, s_shuffled, 1.0)], keep)
        paths["circle_nms, input shuffled"] = lambda: pcops.circle_nms(c_shuffled, s_shuffled, 1.0)
        paths["circle_nms_mask, input shuffled"] = (
            lambda: pcops.circle_nms_mask(c_shuffled, s_shuffled, 1.0))
        for path in ("block", "flow"):
            if n > 4096:
                continue
            out = force("circle_nms", path, c_shuffled, s_shuffled, 1.0, None)
            assert torch.equal(perm[out[1][:len(keep)]], keep), path
            paths[f"{path} path, input shuffled"] = (
                (lambda p: lambda: force("circle_nms", p, c_shuffled, s_shuffled, 1.0, None))(path))
        for name, fn in paths.items():
            host = peer_time(fn, flush, "host")
            event = peer_time(fn, flush, "event")
            kernel = kernel_time(fn)
            target = PEER_TARGETS_MS.get(n)
            met = "" if target is None or "path" in name or "shuffled" in name else (
                "yes" if host <= target else "NO")
            rows.append([n, len(keep), name, f"{host:.4f}", f"{event:.4f}", f"{kernel:.4f}",
                         "" if target is None else f"{target:g}", met])
            print(" ".join(str(x) for x in rows[-1]), flush=True, file=sys.stderr)
    for line in environment_header():
        print(line)
    print("peer benchmark inputs: uniform 100 m x 100 m, radius 1.0, descending scores; "
          "L2 flushed before each call; median of 50")
    print_table(f"circle NMS, issue 9 rows C1-C4, on {device}", header, rows, file=args.out)


def main():
    p = base_parser(__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None, help="comma-separated N (default 1000,4096,10000,30000)")
    p.add_argument("--profile", action="store_true", help="CUDA: also list the time of each kernel")
    p.add_argument("--peer", action="store_true",
                   help="CUDA: the peer benchmark's rows C1-C4 (host clock and events)")
    args = p.parse_args()
    if args.peer:
        peer_main(args)
        return
    device = args.device
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else (
        [1000, 4096] if args.quick else [1000, 4096, 10000, 30000])
    reps = 3 if args.quick else 20
    mmdet3d = mmdet3d_fn()
    gen = torch.Generator().manual_seed(0)

    header = ["N", "groups", "K kept", "pcops", "pcops_mask", "numpy_host", "torch_matrix", "mmdet3d",
              "speedup"]
    if device.startswith("cuda"):
        header += ["floor", "mask GB/s"]
    rows = []
    for N in sizes:
        for n_groups in (0, 10):
            centers, scores, groups = centerpoint_like(N, gen, n_groups)
            c, s = centers.to(device), scores.to(device)
            g = None if groups is None else groups.to(device)
            keep = pcops.circle_nms(c, s, RADIUS, groups=g)
            expected = keep.cpu().tolist()
            t_pcops = time_fn(lambda: pcops.circle_nms(c, s, RADIUS, groups=g), device, reps=reps)
            t_mask = time_fn(lambda: pcops.circle_nms_mask(c, s, RADIUS, g), device, reps=reps)
            # the baselines take seconds at the larger sizes: timed on the calls whose results
            # are checked against pcops, with one warm-up call below 10k boxes only
            slow = dict(reps=1 if N > 10000 or args.quick else 3, warmup=int(N <= 10000))
            t_host = time_checked(lambda: numpy_host(c, s, RADIUS, g), expected, name="numpy_host", **slow)
            t_torch = time_checked(lambda: torch_matrix(c, s, RADIUS, g), expected, name="torch_matrix", **slow)
            t_mm = None
            if mmdet3d is not None:
                t_mm = time_checked(lambda: mmdet3d(c, s, RADIUS, g), expected, name="mmdet3d", **slow)
            best = min(t for t in (t_host, t_torch, t_mm) if t is not None)
            row = [N, n_groups or "-", len(expected), fmt_ms(t_pcops), fmt_ms(t_mask), fmt_ms(t_host),
                   fmt_ms(t_torch), fmt_ms(t_mm), f"{best / t_pcops:.0f}x"]
            if device.startswith("cuda"):
                C = math.ceil(N / 64)
                mask_bytes = N * C * 8 / 2  # the upper triangle, written once and read once
                flops = N * N / 2 * 5  # a pair: 2 subtractions, 2 products, 1 sum
                floor_ms = max(2 * mask_bytes / H100_BYTES_PER_S, flops / H100_FP32_FLOPS) * 1e3
                row += [f"{floor_ms * 1e3:.1f} us", f"{2 * mask_bytes / (t_mask * 1e-3) / 1e9:.0f}"]
            rows.append(row)
            print(" ".join(str(x) for x in row), flush=True, file=sys.stderr)

    if args.profile and device.startswith("cuda"):
        # where the pcops_mask time goes, kernel by kernel (sort, gather, mask, scan)
        for N in sizes:
            centers, scores, groups = centerpoint_like(N, gen, 10)
            c, s, g = centers.to(device), scores.to(device), groups.to(device)
            for _ in range(3):
                pcops.circle_nms_mask(c, s, RADIUS, g)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    pcops.circle_nms_mask(c, s, RADIUS, g)
                torch.cuda.synchronize()
            print(f"## N={N}, 10 groups: CUDA kernels of 10 calls of circle_nms_mask")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))

    for line in environment_header():
        print(line)
    print(f"radius {RADIUS} m; CenterPoint-like scenes: 8 boxes per object, 0.3 m jitter, 102.4 m square")
    print_table(f"circle_nms on {device} (ms, median)", header, rows, file=args.out)


if __name__ == "__main__":
    main()
