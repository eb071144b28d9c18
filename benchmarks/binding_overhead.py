#!/usr/bin/env python3
"""Host time of pcops calls whose work is negligible: tiny CPU inputs (a cloud of 8 points), so
what is measured is the call itself -- Python wrapper, dispatcher, the binding's checks and
allocations (the stable ABI's boxed call, pcops' call hook). Min over 7 batches of 2000 calls,
in microseconds, one thread.

    python3 benchmarks/binding_overhead.py [case ...]   (e.g. knn circle_nms)

To compare two builds, run it in each, alternating a few times (the machine's load varies).
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pcops  # noqa: E402


def cases():
    g = torch.Generator().manual_seed(0)
    q, r = torch.rand(1, 4, 3, generator=g), torch.rand(1, 8, 3, generator=g)
    feat = torch.rand(1, 8, 4, generator=g)
    idx = torch.randint(0, 8, (1, 4, 2), generator=g)
    w = torch.rand(1, 4, 2, generator=g)
    c, s = torch.rand(8, 2, generator=g), torch.rand(8, generator=g)
    # the size of the GPU benchmark's circle NMS row (host-bound there); here the CPU kernel
    # dominates, so this case shows a change of host cost only as a small difference
    c1k, s1k = torch.rand(1000, 2, generator=g) * 50, torch.rand(1000, generator=g)
    ops = torch.ops.pcops
    return {
        "pcops.furthest_point_sample": lambda: pcops.furthest_point_sample(r, 4),
        "pcops.knn": lambda: pcops.knn(q, r, 2),
        "pcops.ball_query": lambda: pcops.ball_query(q, r, 0.5, 2),
        "pcops.group": lambda: pcops.group(feat, idx),
        "pcops.interpolate": lambda: pcops.interpolate(feat, idx, w),
        "pcops.circle_nms": lambda: pcops.circle_nms(c, s, 0.1),
        "pcops.circle_nms_mask": lambda: pcops.circle_nms_mask(c, s, 0.1),
        "pcops.circle_nms N=1000": lambda: pcops.circle_nms(c1k, s1k, 0.5),
        "three_nn_pointnet2 op": lambda: ops.three_nn_pointnet2.default(q, r),
        "knn op (autograd kernel)": lambda: ops.knn.default(q, r, 2),
    }


def main():
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, pcops from {os.path.dirname(pcops.__file__)}")
    only = sys.argv[1:]  # names (or parts of names) of the cases to run; default: all
    for name, fn in cases().items():
        if only and not any(part in name for part in only):
            continue
        for _ in range(200):
            fn()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            times.append((time.perf_counter() - t0) / 2000 * 1e6)
        print(f"{name:28s} {min(times):7.2f} us   (median batch {statistics.median(times):7.2f})")


if __name__ == "__main__":
    main()
