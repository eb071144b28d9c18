#!/usr/bin/env python3
"""Host time of a call with the GPU kept busy (CUDA): how long the Python call itself takes
before it returns, for the peer rows whose time is mostly the call's host part (K2, Q1, F1,
C1's circle_nms_mask and its paths forced through the path op) against a bare `torch.add`. The GPU is kept busy by zeroing a 256 MB buffer three times before
each timed call, so the call never waits for the device; median of 50 calls, in us.

    python3 benchmarks/host_cost.py
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pcops  # noqa: E402


def rand_points(shape, seed, dev):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, 3, generator=g).to(dev)


def main():
    if not torch.cuda.is_available():
        raise SystemExit("host_cost.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    q, r = rand_points((16, 4096), 12, dev), rand_points((16, 4096), 22, dev)
    qb, rb = rand_points((32, 512), 32, dev), rand_points((32, 1024), 42, dev)
    x = rand_points((32, 1024), 2, dev)
    a = torch.zeros(1000, device=dev)
    busy = torch.empty(2**26, device=dev)
    g = torch.Generator().manual_seed(2000)
    nc = (torch.rand(1000, 2, generator=g) * 100).to(dev)
    ns = torch.linspace(1.0, 0.0, 1000).to(dev)
    from benchmarks.common import circle_nms_path
    mask_op = torch.ops.pcops.circle_nms_mask.default
    cases = {"torch.add": lambda: torch.add(a, 1),
             "knn K2 (16 x 4096, k=16)": lambda: pcops.knn(q, r, 16),
             "ball_query Q1 (32 x 512 of 1024)": lambda: pcops.ball_query(qb, rb, 0.2, 32),
             "furthest_point_sample F1 (32 x 1024 -> 512)":
                 lambda: pcops.furthest_point_sample(x, 512),
             "torch.empty (1000 int64)": lambda: torch.empty(1000, dtype=torch.long, device=dev),
             "circle_nms_mask C1 (1000)": lambda: pcops.circle_nms_mask(nc, ns, 1.0),
             "torch.ops.pcops.circle_nms_mask (1000)": lambda: mask_op(nc, ns, 1.0, None),
             "circle NMS flow path, forced (cooperative launch)":
                 lambda: circle_nms_path(nc, ns, 1.0, None, path="flow"),
             "circle NMS block path, forced (plain launch)":
                 lambda: circle_nms_path(nc, ns, 1.0, None, path="block")}
    print(torch.cuda.get_device_name(dev), torch.__version__)
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        ts = []
        for _ in range(50):
            busy.zero_(), busy.zero_(), busy.zero_()
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        print(f"host time of the call (GPU busy), {name}: median {statistics.median(ts):.1f} us")


if __name__ == "__main__":
    main()
