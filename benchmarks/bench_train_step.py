"""PointNet++ on pcops: time of a training step and of an inference step, several configurations
side by side.

    python benchmarks/bench_train_step.py                       # SSG, B=32, N=1024 on the GPU
    python benchmarks/bench_train_step.py --profile              # + the top kernels of the fastest
    python benchmarks/bench_train_step.py --quick                # CPU smoke run, tiny sizes

Training step = forward + cross-entropy + backward + fused Adam step + zero_grad, the way
models/train.py runs it. Inference step = eval mode, torch.inference_mode. Both are medians of
CUDA-event timings (perf_counter on the CPU) after warm-up; the first call of each compiled
configuration (its compilation) is reported separately. Inputs are built-in procedural shapes
(surfaces, so ball queries see realistic neighbourhoods).

Configurations (--configs; default on CUDA: eager-fp32, compile-bf16, eager-bf16, compile-fp32,
compile-bf16-reduce-overhead (CUDA graphs, as the ModelNet40 preset trains), torchops-fp32), and
compile-bf16-<mode> for any torch.compile mode (e.g. compile-bf16-max-autotune-no-cudagraphs).
torchops-fp32 is the baseline in the same run: the same model, eager, with FPS, ball query / kNN
and group written in plain PyTorch as a user would (the functions the op benchmarks time: an FPS
loop, cdist + topk, gather), so the speed-up of the pcops rows is measured on this machine.
fp32 uses TF32 matmuls unless --no-tf32. Configurations not started within --time-limit seconds
are skipped, so that a run with slow compilations still prints its table.

Under torchrun (WORLD_SIZE > 1) every process times the same step on its own GPU, with the
gradients averaged over the processes after the backward pass as models.train does it
(models.distributed.average_gradients: one NCCL all-reduce of a flat buffer); rank 0 prints. Compare
    python benchmarks/bench_train_step.py --configs compile-bf16-reduce-overhead --points 736
    torchrun --nproc_per_node 2 benchmarks/bench_train_step.py --configs compile-bf16-reduce-overhead \
        --points 736
"""
import argparse
import contextlib
import os
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pcops  # noqa: E402
from bench_ball_query import torch_ball_query  # noqa: E402
from bench_fps import fps_torch_loop  # noqa: E402
from bench_group import torch_group  # noqa: E402
from bench_knn import run_torch as torch_knn  # noqa: E402
from common import environment_header, fmt_ms, print_table, time_fn  # noqa: E402
from models import pointnet2  # noqa: E402
from models.data import ProceduralShapes  # noqa: E402
from models.pointnet2 import build_model  # noqa: E402
from models.distributed import average_gradients  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))

GPU_CONFIGS = ["eager-fp32", "compile-bf16", "eager-bf16", "compile-fp32", "compile-bf16-reduce-overhead",
               "torchops-fp32"]
CPU_CONFIGS = ["eager-fp32", "eager-bf16", "torchops-fp32"]

# The baseline's stand-ins for the four pcops functions the model calls, in plain PyTorch.
TORCH_OPS = types.SimpleNamespace(
    furthest_point_sample=fps_torch_loop,
    ball_query=torch_ball_query,
    group=torch_group,
    knn=lambda query, ref, k: torch_knn(query, ref, k, 4 << 30),
)


def parse_config(name):
    """'eager|compile|torchops - fp32|bf16 [- compile mode]' -> (compiled, bf16, mode, torch ops)."""
    parts = name.split("-", 2)
    if len(parts) < 2 or parts[0] not in ("eager", "compile", "torchops") or parts[1] not in ("fp32", "bf16"):
        raise SystemExit(f"bad configuration {name!r}: eager|compile|torchops - fp32|bf16 [- compile mode]")
    mode = parts[2] if len(parts) == 3 else None
    if mode and parts[0] != "compile":
        raise SystemExit(f"bad configuration {name!r}: a compile mode needs 'compile'")
    return parts[0] == "compile", parts[1] == "bf16", mode, parts[0] == "torchops"


@contextlib.contextmanager
def ops_of_model(torch_ops):
    """Runs the model on TORCH_OPS instead of pcops (for the baseline) inside the block."""
    if not torch_ops:
        yield
        return
    pointnet2.pcops = TORCH_OPS
    try:
        yield
    finally:
        pointnet2.pcops = pcops


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_config(name, args, device, xyz, labels):
    compiled, bf16, mode, torch_ops = parse_config(name)
    with ops_of_model(torch_ops):
        return _run_config(name, args, device, xyz, labels, compiled, bf16, mode)


def _run_config(name, args, device, xyz, labels, compiled, bf16, mode):
    torch.manual_seed(0)
    model = build_model(args.model, 40, grouping=args.grouping).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if device.type == "cuda" else {}))
    net = torch.compile(model, mode=mode, dynamic=False) if compiled else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    params = list(model.parameters())

    def train_step():
        with autocast:
            logits = net(xyz)
        F.cross_entropy(logits.float(), labels).backward()
        if WORLD > 1:
            average_gradients(params, WORLD)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        with torch.inference_mode(), autocast:
            return net(xyz)

    row = {"config": name}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model.train()
    t = time.perf_counter()
    train_step()
    sync(device)
    row["first train call (s)"] = f"{time.perf_counter() - t:.1f}"
    row["train step (ms)"] = time_fn(train_step, device, warmup=args.warmup, reps=args.reps)
    if device.type == "cuda":
        row["train peak mem (GB)"] = f"{torch.cuda.max_memory_allocated() / 2**30:.2f}"
    model.eval()
    t = time.perf_counter()
    infer_step()
    sync(device)
    row["first eval call (s)"] = f"{time.perf_counter() - t:.1f}"
    row["inference (ms)"] = time_fn(infer_step, device, warmup=args.warmup, reps=args.reps)
    return row, model, train_step


def ops_only(args, device, xyz):
    """The SSG/MSG levels' sampling and grouping alone (FPS, ball query / kNN, group of the
    coordinates), to show what share of a step the pcops ops are."""
    model = build_model(args.model, 40, grouping=args.grouping).to(device)

    def run():
        pts, C = xyz, 0
        for sa in model.sa[:-1]:
            idx = pcops.furthest_point_sample(pts, sa.npoint)
            centres = pcops.group(pts, idx.unsqueeze(-1)).squeeze(2)
            for radius, nsample in zip(sa.radii, sa.nsamples):
                nbr = (pcops.ball_query(centres, pts, radius, nsample) if sa.grouping == "ball"
                       else pcops.knn(centres, pts, nsample)[1])
                pcops.group(pts, nbr)
                if C:
                    pcops.group(feats, nbr)
            feats = torch.zeros(xyz.shape[0], sa.npoint, sa.out_channels, device=device,
                                dtype=torch.bfloat16)
            pts, C = centres, sa.out_channels

    with torch.inference_mode():
        return time_fn(run, device, warmup=args.warmup, reps=args.reps)


def profile(train_step, device, steps=5):
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            train_step()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"## top kernels over {steps} training steps of the fastest configuration")
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="ssg", choices=["ssg", "msg", "ssg-lite"])
    p.add_argument("--grouping", default="ball", choices=["ball", "knn"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--points", type=int, default=1024)
    p.add_argument("--configs", nargs="+", default=None, help=f"default: {' '.join(GPU_CONFIGS)} (CPU: eager only)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--time-limit", type=float, default=200.0,
                   help="skip the configurations not started within this many seconds (compilation is slow)")
    p.add_argument("--profile", action="store_true", help="print the top kernels of the fastest training step")
    p.add_argument("--quick", action="store_true", help="smoke run: B=2, N=600, few repetitions")
    p.add_argument("--out", default=None, help="append the table to this file")
    args = p.parse_args()
    device = torch.device(args.device)
    if WORLD > 1:  # torchrun: one GPU per process, rank 0 reports
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if dist.get_rank() != 0:
            sys.stdout = open(os.devnull, "w")
        args.out = args.out if dist.get_rank() == 0 else None
    if args.quick:
        args.batch, args.points, args.warmup, args.reps = 2, 600, 1, 3
    configs = args.configs or (GPU_CONFIGS if device.type == "cuda" else CPU_CONFIGS)
    for name in configs:
        parse_config(name)  # fail on a typo before anything runs
    if device.type == "cuda" and args.tf32:
        torch.set_float32_matmul_precision("high")

    shapes = ProceduralShapes(args.batch, args.points, seed=0).materialize()
    xyz, labels = shapes.points.to(device), torch.randint(0, 40, (args.batch,), device=device)

    header = environment_header()
    header.append(f"PointNet++ {args.model} ({args.grouping}), B={args.batch}"
                  f"{f' per process x {WORLD} processes (gradients all-reduced)' if WORLD > 1 else ''}, "
                  f"N={args.points}, "
                  f"Adam, TF32 {'on' if args.tf32 else 'off'}, warm-up {args.warmup}, median of {args.reps}")
    print("\n".join(header), flush=True)
    rows, best, t_start = [], None, time.perf_counter()
    for name in configs:
        if time.perf_counter() - t_start > args.time_limit:
            print(f"{name}: skipped (--time-limit {args.time_limit:g} s reached)", flush=True)
            rows.append({"config": name + " (skipped)"})
            continue
        try:
            row, model, step = run_config(name, args, device, xyz, labels)
        except Exception as e:  # one failing configuration (e.g. a compile mode) must not hide the others
            print(f"{name}: FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            rows.append({"config": name + " (failed)"})
            continue
        print(f"{name}: train {fmt_ms(row['train step (ms)'])} ms, inference {fmt_ms(row['inference (ms)'])} ms",
              flush=True)
        rows.append(row)
        if best is None or row["train step (ms)"] < best[0]:
            best = (row["train step (ms)"], name, step)
        del model
    # speed-ups against the plain-PyTorch baseline when it ran, else against the first row
    timed_rows = [r for r in rows if r.get("train step (ms)") is not None]
    base = next((r for r in timed_rows if r["config"].startswith("torchops")), timed_rows[0] if timed_rows else None)
    cols = ["config", "train step (ms)", "inference (ms)", f"train speedup vs {base['config'] if base else '-'}",
            "inference speedup", "first train call (s)", "first eval call (s)"]
    cols += ["train peak mem (GB)"] if device.type == "cuda" else []
    table = []
    for r in rows:
        if "train step (ms)" not in r:
            table.append([r["config"]] + ["-"] * (len(cols) - 1))
            continue
        speedup = f"{base['train step (ms)'] / r['train step (ms)']:.2f}x"
        infer_speedup = f"{base['inference (ms)'] / r['inference (ms)']:.2f}x"
        table.append([r["config"], fmt_ms(r["train step (ms)"]), fmt_ms(r["inference (ms)"]), speedup,
                      infer_speedup, r["first train call (s)"], r["first eval call (s)"]]
                     + ([r["train peak mem (GB)"]] if device.type == "cuda" else []))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(header) + "\n\n")
    print_table(f"PointNet++ {args.model} training and inference step on pcops", cols, table, file=args.out)
    ops_ms = ops_only(args, device, xyz)
    print(f"pcops sampling + grouping alone (inference, all levels): {fmt_ms(ops_ms)} ms", flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"pcops sampling + grouping alone (inference, all levels): {fmt_ms(ops_ms)} ms\n\n")
    if args.profile and best is not None:
        print(f"profiling {best[1]}", flush=True)
        profile(best[2], device)


if __name__ == "__main__":
    main()
