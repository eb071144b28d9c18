"""Benchmark of pcops.preprocess on the real scans (issue 10).

    python benchmarks/bench_preprocess.py --device cuda            # the H100 numbers
    python benchmarks/bench_preprocess.py --device cpu --small     # a CPU run in minutes

Rows (npoint 16384, kNN 16, grouped coordinates; --small: npoint 4096):
  1 scan/call    the KITTI scan (115 384 points), in memory: eager pcops.preprocess and the
                 CUDA graph (GraphedPreprocess), from a device tensor and from host memory
  8 scans/call   a ragged batch of 4 KITTI + 4 nuScenes scans (34 688 points)
  stream         preprocess_stream over 64 host scans in batches of 8 (CUDA graph), with the
                 side-stream copies from pinned memory (overlap) and without (pageable copies on
                 the compute stream): scans/s and the overlap gain
  command        python -m pcops.preprocess on a temp folder of 200 copies of the real scans
                 (.npy), as a subprocess: the command's own clouds/s and points/s

Times are medians of CUDA-event (GPU) or perf_counter (CPU) timings after warm-up
(benchmarks/common.py). Scans/s = scans per call / median time.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import pcops  # noqa: E402
from common import environment_header, time_fn  # noqa: E402

SCAN_DIRS = [os.path.join(ROOT, ".data", "scans"), os.path.join(ROOT, "..", "shared", "data", "scans"),
             "/work/shared/data/scans"]


def find_scans():
    for d in SCAN_DIRS:
        files = sorted(glob.glob(os.path.join(d, "*.npy")))
        if files:
            return files
    raise SystemExit("bench_preprocess: no real scans in " + ", ".join(SCAN_DIRS))


def row(name, ms, scans, points):
    print(f"| {name:<44} | {ms:10.2f} | {scans / (ms / 1e3):9.1f} | {points / (ms / 1e3) / 1e6:8.2f} |")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="npoint 4096, fewer copies and repetitions (CPU)")
    p.add_argument("--npoint", type=int, default=None)
    p.add_argument("--nsample", type=int, default=16)
    p.add_argument("--copies", type=int, default=None, help="files for the command (default 200, --small 24)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--skip-command", action="store_true")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    npoint = args.npoint or (4096 if args.small else 16384)
    nsample = args.nsample
    copies = args.copies or (24 if args.small else 200)
    reps = args.reps or (3 if args.small else 20)
    warmup = 1 if args.small else 3

    files = find_scans()
    scans = {os.path.basename(f): np.load(f).astype(np.float32) for f in files}
    kitti = next(v for k, v in scans.items() if k.startswith("kitti"))
    nusc = next(v for k, v in scans.items() if k.startswith("nuscenes"))
    print("\n".join(environment_header()))
    print(f"\nKITTI {len(kitti)} points, nuScenes {len(nusc)} points -> npoint {npoint}, kNN {nsample}, "
          f"grouped coordinates; device {device}; median of {reps}\n")
    print(f"| {'case':<44} | {'ms/call':>10} | {'scans/s':>9} | {'Mpts/s':>8} |")
    print(f"|{'-' * 46}|{'-' * 12}|{'-' * 11}|{'-' * 10}|")

    def bench(fn):
        return time_fn(fn, device.type, warmup=warmup, reps=reps)

    # one scan per call ------------------------------------------------------------------------
    k_dev = torch.from_numpy(kitti).to(device)[None]
    k_len = torch.tensor([len(kitti)], device=device)
    run = lambda: pcops.preprocess(k_dev, npoint, nsample, lengths=k_len)  # noqa: E731
    row("1 scan/call, eager, on the device", bench(run), 1, len(kitti))
    run = lambda: pcops.preprocess(kitti, npoint, nsample, device=device)  # noqa: E731
    row("1 scan/call, eager, from host memory", bench(run), 1, len(kitti))
    if device.type == "cuda":
        graph = pcops.GraphedPreprocess(npoint, nsample, device=device)
        row("1 scan/call, CUDA graph, on the device", bench(lambda: graph(k_dev, lengths=k_len)), 1, len(kitti))
        row("1 scan/call, CUDA graph, from host memory", bench(lambda: graph([kitti])), 1, len(kitti))

    # 8 scans per call (ragged) ----------------------------------------------------------------
    eight = [kitti, nusc] * 4
    pts8 = sum(len(c) for c in eight)
    x8, l8, _ = pcops.preprocess.pad_clouds([torch.from_numpy(c) for c in eight])
    x8, l8 = x8.to(device), l8.to(device)
    row("8 scans/call (4 KITTI + 4 nuSc.), eager, device",
        bench(lambda: pcops.preprocess(x8, npoint, nsample, lengths=l8)), 8, pts8)
    row("8 scans/call, eager, from host memory",
        bench(lambda: pcops.preprocess(eight, npoint, nsample, device=device)), 8, pts8)
    if device.type == "cuda":
        graph8 = pcops.GraphedPreprocess(npoint, nsample, device=device)
        row("8 scans/call, CUDA graph, device", bench(lambda: graph8(x8, lengths=l8)), 8, pts8)
        row("8 scans/call, CUDA graph, from host memory", bench(lambda: graph8(eight)), 8, pts8)

    # the stream iterator ----------------------------------------------------------------------
    if device.type == "cuda":
        stream_scans = eight * 8  # 64 host scans
        pts = sum(len(c) for c in stream_scans)
        res = {}
        for overlap in (False, True):
            def consume():
                for out in pcops.preprocess_stream(stream_scans, npoint, nsample, batch_size=8, device=device,
                                                   graphed=True, overlap=overlap):
                    pass
            consume()  # warm-up: captures the graphs
            times = []
            for _ in range(max(3, reps // 4)):
                sync(device)
                t0 = time.perf_counter()
                consume()
                sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
            res[overlap] = float(np.median(times))
            row(f"stream, 64 host scans, batch 8, graph, overlap={overlap}", res[overlap], 64, pts)
        print(f"\noverlap gain (side-stream pinned copies vs pageable copies on the compute stream): "
              f"{res[False] / res[True]:.2f}x")

    # the command ------------------------------------------------------------------------------
    if not args.skip_command:
        tmp = tempfile.mkdtemp(prefix="pcops_bench_preprocess_")
        inputs = os.path.join(tmp, "scans")  # the caches go beside it, not into the inputs
        os.makedirs(inputs)
        try:
            names = list(scans)
            for i in range(copies):
                shutil.copy(os.path.join(os.path.dirname(files[0]), names[i % len(names)]),
                            os.path.join(inputs, f"scan_{i:04d}_{names[i % len(names)]}"))
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            for dev in (["cpu", "cuda"] if device.type == "cuda" else ["cpu"]):
                out = os.path.join(tmp, f"cache_{dev}")
                cmd = [sys.executable, "-m", "pcops.preprocess", inputs, "-o", out, "--npoint", str(npoint),
                       "--nsample", str(nsample), "--batch-size", "8", "--device", dev, "--no-progress"]
                t0 = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
                wall = time.perf_counter() - t0
                if r.returncode != 0:
                    print(f"command on {dev} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
                    continue
                summary = r.stdout.strip().splitlines()[-1]
                m = re.search(r"([\d.]+) clouds/s, ([\d.e+]+) points/s", summary)
                print(f"\ncommand, {copies} files, --device {dev}, batch 8: {m.group(1)} scans/s, "
                      f"{float(m.group(2)) / 1e6:.2f} M points/s (process wall time {wall:.1f} s, "
                      f"start-up included)\n  {' '.join(cmd[1:3])} <folder> -o <cache> {' '.join(cmd[6:])}\n  {summary}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
