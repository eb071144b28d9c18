"""Timing and table helpers shared by the benchmarks in benchmarks/.

Device time, not host time: on CUDA each repetition is bracketed by CUDA events and the median
is reported; on the CPU, time.perf_counter around each call. Warm-up calls come first so that
library loading, allocator growth and compilation stay out of the numbers.
"""
import argparse
import importlib
import os
import platform
import statistics
import subprocess
import sys
import time

import torch


def time_fn(fn, device, *, warmup=3, reps=20, min_time_s=0.0, flush=None):
    """Median milliseconds of fn() on `device` ("cpu" or "cuda"); runs at least `reps` times
    and, if min_time_s > 0, until that much time was spent. CUDA: `flush` (a device buffer
    larger than L2) is zeroed before each timed call, so each call starts with L2 cold."""
    for _ in range(warmup):
        fn()
    times = []
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        start_all = time.perf_counter()
        while len(times) < reps or time.perf_counter() - start_all < min_time_s:
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        start_all = time.perf_counter()
        while len(times) < reps or time.perf_counter() - start_all < min_time_s:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def try_import(name):
    """A peer library if it is installed (pytorch3d, torch_cluster, pointnet2_ops), else None."""
    try:
        return importlib.import_module(name)  # the submodule itself for dotted names
    except Exception:
        return None


def environment_header(command=None):
    """Lines naming the machine and the versions, for the top of a results table."""
    lines = [f"command: {command or ' '.join([os.path.basename(sys.executable)] + sys.argv)}"]
    lines.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}), python {platform.python_version()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip().splitlines()[0]
        except Exception:
            driver = "?"
        lines.append(f"GPU: {p.name}, {p.multi_processor_count} SMs, driver {driver}")
    lines.append(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                 f"torch threads {torch.get_num_threads()}")
    return lines


def print_table(title, header, rows, file=None):
    """A fixed-width table; also echoed to `file` (a path) when given."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [f"## {title}", fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in rows]
    text = "\n".join(out)
    print(text, flush=True)
    if file:
        with open(file, "a") as f:
            f.write(text + "\n\n")
    return text


def fmt_ms(ms):
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def base_parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions (smoke run)")
    p.add_argument("--out", default=None, help="append the tables to this file")
    return p


# Forced paths (pcops._paths): each op through one of its paths, keyword `path`.
def fps_path(xyz, npoint, lengths=None, start=None, *, path="auto"):
    from pcops._paths import force
    return force("furthest_point_sample", path, xyz, npoint, lengths, start)


def knn_path(query, ref, k, query_lengths=None, ref_lengths=None, *, path="auto"):
    from pcops._paths import force
    return force("knn", path, query, ref, k, query_lengths, ref_lengths)


def ball_query_path(query, ref, radius, nsample, query_lengths=None, ref_lengths=None, *,
                    path="auto"):
    from pcops._paths import force
    return force("ball_query", path, query, ref, radius, nsample, query_lengths, ref_lengths)


def circle_nms_path(centers, scores, radius, groups=None, *, path="auto"):
    from pcops._paths import force
    return force("circle_nms", path, centers, scores, radius, groups)
