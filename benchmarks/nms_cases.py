#!/usr/bin/env python3
"""Kernel time of the block and flow circle NMS paths (N <= 4096) on hard inputs: uniform boxes (the peer benchmark's, in score order and shuffled), a chain of
boxes on a line visited along it (sorted and shuffled: each box waits on the one before), a
dense spot (every box within the radius of every other) and CenterPoint-like clusters. Every
output is checked against the CPU. Kernel time from torch.profiler (L2 warm), us; CUDA only:

    python3 benchmarks/nms_cases.py 100,500,1000,2048,4096
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_circle_nms import kernel_time, peer_inputs  # noqa: E402
from benchmarks.common import circle_nms_path  # noqa: E402


def cases(n, dev, g):
    c, s = peer_inputs(n, dev)
    yield "uniform sorted", c, s, 1.0
    p = torch.randperm(n, generator=g).to(dev)
    yield "uniform shuffled", c[p], s[p], 1.0
    line = torch.zeros(n, 2)
    line[:, 0] = torch.arange(n, dtype=torch.float32) * 0.45
    ls = torch.linspace(1.0, 0.0, n)
    yield "chain sorted", line.to(dev), ls.to(dev), 0.5
    p = torch.randperm(n, generator=g)
    yield "chain shuffled", line[p].to(dev), ls[p].to(dev), 0.5
    yield ("dense", (torch.rand(n, 2, generator=g) * 0.1).to(dev),
           torch.rand(n, generator=g).to(dev), 1.0)
    objects = torch.rand(max(n // 8, 1), 2, generator=g) * (n ** 0.5) * 2
    which = torch.randint(0, len(objects), (n,), generator=g)
    xy = objects[which] + torch.randn(n, 2, generator=g) * 0.3
    yield "clustered", xy.to(dev), torch.rand(n, generator=g).to(dev), 0.5


def main():
    if not torch.cuda.is_available():
        raise SystemExit("nms_cases.py: needs a CUDA GPU")
    sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1000,4096").split(",")]
    g = torch.Generator().manual_seed(5)
    print(torch.cuda.get_device_name(), torch.__version__)
    for n in sizes:
        for name, c, s, r in cases(n, "cuda", g):
            ref = circle_nms_path(c.cpu(), s.cpu(), r, None)
            line = f"N={n:5d} {name:18s} kept {int(ref[2]):5d} |"
            for path in ("block", "flow"):
                out = circle_nms_path(c, s, r, None, path=path)
                same = all(torch.equal(a.cpu(), b) for a, b in zip(out, ref))
                us = kernel_time(lambda: circle_nms_path(c, s, r, None, path=path)) * 1e3
                line += f" {path} {us:7.1f}us{'' if same else ' WRONG'} |"
            print(line, flush=True)


if __name__ == "__main__":
    main()
