#!/usr/bin/env python3
"""Circle NMS on hard layouts: is the time of any layout of N boxes within 3x the time of
uniform boxes at the same N, on the CPU and on CUDA (issue 34, item 5)?

    python3 benchmarks/bench_nms_layouts.py --device cpu  [--sizes 10000,100000,300000,1000000]
    python3 benchmarks/bench_nms_layouts.py --device cuda [--bitmask-shim .peerbench/shims]

Layouts (N boxes, float32 centres, scores uniform in [0, 1) from a fixed seed, radius 1; the
uniform density is one box per unit square, about 3 neighbours within the radius):
  uniform           centres uniform in a square of side sqrt(N)
  line              x uniform in [0, N), y = 0 (one box per unit of length)
  line + far box    the line, and box 0 at y = 10 N (off its axis, far out)
  two far clusters  two uniform squares of N / 2 boxes each (density 1), 1e5 apart
  all equal         every centre at (5, 5): the first box removes all the others
  exponential       x and y = +-exp(U(-20, 20)): a dense core, the rest spread over 1e9
  dense clusters    N / 100 clusters of 100 boxes (normal, sigma 0.2: most within one radius
                    of each other), cluster centres uniform in a square of side 3 sqrt(N / 100)
Every result is checked: CUDA against the CPU (the same kept boxes, in order); the bitmask
baseline's kept set is compared with pcops's (differences are reported, not fatal: the peer's
kernel may round its distances differently, by an FMA).

Times (ms, median): CPU, time.perf_counter around pcops.circle_nms (one thread), median of 3
(1 at N = 1e6); CUDA, a CUDA event pair around pcops.circle_nms (its one host synchronisation
included), a 256 MB buffer zeroed before each call (L2 cold), median of 30 up to 30,000 boxes
(10 above; the bitmask 20 and 3). Printed: a markdown
table per device, each layout's time and its ratio to uniform at the same N ("x uniform").

On CUDA also the plain bitmask NMS of the peer benchmark (../shared/peerbench/shims: the
N x N/64 mask of 64-bit words on the GPU, copied to a pinned host buffer, scanned in order on
the host; the score sort by torch.sort included) on the clustered layouts (two far clusters,
dense clusters) up to --bitmask-max boxes (the mask is N**2 / 8 bytes), and pcops's speedup
over it. It is built with torch.utils.cpp_extension from --bitmask-shim (default: the first of
.peerbench/shims and ../shared/peerbench/shims that exists; about a minute); without it, the
same scheme in torch ops with the scan in NumPy stands in, marked as such (slower than the
peer's, so its speedups are upper bounds).
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
from common import environment_header, time_fn  # noqa: E402

import pcops  # noqa: E402

RADIUS = 1.0
LAYOUTS = ["uniform", "line", "line + far box", "two far clusters", "all equal", "exponential",
           "dense clusters"]
CLUSTERED = ["two far clusters", "dense clusters"]


def layout(name, n, seed=0):
    """(centres [n, 2] float32, scores [n] float32) on the CPU."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    if name == "uniform":
        xy = u(n, 2) * math.sqrt(n)
    elif name in ("line", "line + far box"):
        xy = torch.zeros(n, 2, dtype=torch.float64)
        xy[:, 0] = u(n) * n
        if name == "line + far box":
            xy[0, 1] = 10.0 * n
    elif name == "two far clusters":
        xy = u(n, 2) * math.sqrt(n / 2)
        xy[n // 2:] += 1e5
    elif name == "all equal":
        xy = torch.full((n, 2), 5.0, dtype=torch.float64)
    elif name == "exponential":
        sign = torch.where(u(n, 2) < 0.5, -1.0, 1.0)
        xy = sign * torch.exp(u(n, 2) * 40.0 - 20.0)
    elif name == "dense clusters":
        k = max(n // 100, 1)
        centres = u(k, 2) * 3.0 * math.sqrt(k)
        xy = centres[torch.arange(n) % k] + torch.randn(n, 2, generator=g, dtype=torch.float64) * 0.2
    else:
        raise ValueError(name)
    return xy.float(), u(n).float()


def load_bitmask_shim(path):
    """The peer benchmark's bitmask NMS module, built from `path` (None: not found), or loaded
    from `path` when it is the .so the peer benchmark built (.peerbench/built/nms/*.so)."""
    if path is not None and path.endswith(".so"):
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            os.path.basename(path)[:-3], os.path.abspath(path))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    if path is None:
        for p in (os.path.join(ROOT, ".peerbench", "shims"),
                  os.path.join(ROOT, "..", "shared", "peerbench", "shims")):
            if os.path.exists(os.path.join(p, "circle_nms_bitmask.cu")):
                path = p
                break
    if path is None:
        return None
    from torch.utils.cpp_extension import load
    build = os.path.join(ROOT, "build", "bench_nms_bitmask")
    os.makedirs(build, exist_ok=True)
    t0 = time.perf_counter()
    mod = load("bench_nms_bitmask", [os.path.join(path, "circle_nms_shim.cpp"),
                                     os.path.join(path, "circle_nms_bitmask.cu")],
               build_directory=build, extra_cuda_cflags=["-O3"], verbose=False)
    print(f"bitmask shim from {path} built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return mod


def torch_bitmask(xy, radius):
    """The bitmask scheme in torch ops (boxes already in score order): the mask of later boxes
    within the radius on the device, 128 rows at a time, then the host scan in NumPy."""
    dev, n = xy.device, len(xy)
    words = (n + 63) // 64
    weights = 2 ** torch.arange(64, device=dev, dtype=torch.int64)
    weights[63] = -(2 ** 63)
    mask = torch.empty(n, words, dtype=torch.int64, device=dev)
    cols = torch.arange(n, device=dev)
    for r0 in range(0, n, 128):
        rows = xy[r0:r0 + 128]
        d = (rows[:, None, 0] - xy[None, :, 0]) ** 2 + (rows[:, None, 1] - xy[None, :, 1]) ** 2
        hit = (d < radius * radius) & (cols[None, :] > cols[r0:r0 + len(rows), None])
        hit = torch.nn.functional.pad(hit, (0, words * 64 - n)).view(len(rows), words, 64)
        mask[r0:r0 + len(rows)] = (hit.to(torch.int64) * weights).sum(-1)
    host = mask.cpu().numpy().view(np.uint64)
    removed = np.zeros(words, dtype=np.uint64)
    keep = []
    for i in range(n):
        w, b = divmod(i, 64)
        if (int(removed[w]) >> b) & 1:
            continue
        keep.append(i)
        removed[w:] |= host[i, w:]
    return torch.tensor(keep, dtype=torch.int64)


def fmt(ms):
    return "-" if ms is None else (f"{ms:.3g}" if ms < 100 else f"{ms:.0f}")


def table(title, sizes, times, base_name="uniform", label="x uniform"):
    """Markdown: a row per layout, per N its time and its ratio to the base row."""
    lines = [f"#### {title}", "",
             "| layout | " + " | ".join(f"N={n:,}: ms ({label})" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for name, row in times.items():
        cells = []
        for n in sizes:
            t, base = row.get(n), times.get(base_name, {}).get(n)
            cells.append("-" if t is None else
                         f"{fmt(t)} ({t / base:.2f}x)" if base else fmt(t))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sizes", default="10000,100000,300000,1000000")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--bitmask-max", type=int, default=100000)
    p.add_argument("--bitmask-shim", default=None,
                   help="folder with circle_nms_bitmask.cu, or the peer benchmark's built .so")
    p.add_argument("--out", default=None, help="also append the tables to this file")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    names = args.layouts.split(",")
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_nms_layouts.py: --device cuda needs a CUDA GPU")
    header = environment_header()
    for line in header:
        print(line)
    flush = torch.empty(256 * 2**20 // 4, device=dev) if dev == "cuda" else None
    shim = load_bitmask_shim(args.bitmask_shim) if dev == "cuda" else None
    times = {name: {} for name in names}
    bitmask = {}
    for n in sizes:
        for name in names:
            c, s = layout(name, n)
            t0 = time.perf_counter()
            want = pcops.circle_nms(c, s, RADIUS)  # the CPU's answer (and a warm-up there)
            first = (time.perf_counter() - t0) * 1e3
            if dev == "cpu":
                reps = 1 if n >= 1000000 else 3
                t = first if reps == 1 else time_fn(lambda: pcops.circle_nms(c, s, RADIUS), "cpu",
                                                    warmup=0, reps=reps)
            else:
                cd, sd = c.cuda(), s.cuda()
                got = pcops.circle_nms(cd, sd, RADIUS).cpu()
                assert torch.equal(got, want), f"{name}, N={n}: CUDA keeps other boxes than the CPU"
                t = time_fn(lambda: pcops.circle_nms(cd, sd, RADIUS), "cuda", warmup=2,
                            reps=30 if n <= 30000 else 10, flush=flush)
                if name in CLUSTERED and n <= args.bitmask_max:
                    if shim is not None:
                        fn = lambda: shim.circle_nms(  # noqa: E731
                            cd[torch.sort(sd, descending=True, stable=True).indices], RADIUS, True)
                    else:
                        fn = lambda: torch_bitmask(  # noqa: E731
                            cd[torch.sort(sd, descending=True, stable=True).indices], RADIUS)
                    order = torch.sort(s, descending=True, stable=True).indices
                    other = set(order[fn()].tolist()) ^ set(want.tolist())
                    if other:  # the peer's kernel may contract dx*dx + dy*dy into an FMA
                        print(f"note: {name}, N={n}: the bitmask NMS keeps {len(other)} boxes "
                              "other than pcops (distances within rounding of the radius)",
                              file=sys.stderr)
                    bt = time_fn(fn, "cuda", warmup=1, reps=20 if n <= 30000 else 3, flush=flush)
                    bitmask.setdefault(f"{name}: bitmask", {})[n] = bt
                    bitmask.setdefault(f"{name}: pcops", {})[n] = t
            times[name][n] = t
            print(f"N={n} {name:18s} {dev}: {t:.3f} ms, kept {len(want)}", file=sys.stderr,
                  flush=True)
    text = [f"radius {RADIUS}; scores uniform random; median ms and the ratio to uniform"]
    text.append(table(f"pcops.circle_nms on {dev}", sizes, times))
    if bitmask:
        kind = "the peer benchmark's shim" if shim is not None else "torch stand-in (slower)"
        bsizes = [n for n in sizes if n <= args.bitmask_max]
        for name in CLUSTERED:
            if f"{name}: bitmask" not in bitmask:
                continue
            rows = {"bitmask NMS": bitmask[f"{name}: bitmask"], "pcops": bitmask[f"{name}: pcops"]}
            text.append(table(f"{name}: pcops against the plain bitmask NMS ({kind})", bsizes,
                              rows, base_name="pcops", label="x pcops"))
    out = "\n".join(text)
    print(out, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(header) + "\n\n" + out + "\n")


if __name__ == "__main__":
    main()
