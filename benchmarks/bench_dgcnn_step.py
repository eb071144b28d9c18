"""DGCNN (models/dgcnn.py): training-step time with its kNN graphs on pcops.knn against the same
network on the plain-torch kNN of DGCNN's reference code (matmul + topk), side by side.

    python benchmarks/bench_dgcnn_step.py                  # B=32, N=1024, k=20 on the GPU
    python benchmarks/bench_dgcnn_step.py --points 736     # the ModelNet40 preset's points
    python benchmarks/bench_dgcnn_step.py --quick          # CPU smoke run, small sizes

Training step = forward + cross-entropy (label smoothing 0.2) + backward + SGD step (momentum
0.9) + zero_grad, the way models.train runs the modelnet40-dgcnn preset. Medians of CUDA-event
timings (perf_counter on the CPU) after warm-up; the first call of a configuration (with its
compilation, if compiled) is reported on its own. Inputs: built-in procedural shapes (surfaces).

Configurations (--configs): <knn backend>-<eager|compile>-<fp32|bf16>, knn backend pcops or
torch; the two backends run the same network with the same weights, only the four kNN graphs
differ (the gathers are pcops.group in both). Default on CUDA: each backend eager fp32, eager
bf16 and compiled bf16; on the CPU: eager fp32. fp32 uses TF32 matmuls unless --no-tf32 (the
torch backend's distance matmul too, as a user's DGCNN would run with torch's 'high' precision).

The second table is the kNN graphs alone (inference), on the features of each EdgeConv's input
as a forward pass of the model produces them (D = 3, 64, 64, 128), for each backend, and the
share of points whose k neighbours (as sets) the two backends agree on.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import environment_header, fmt_ms, print_table, time_fn  # noqa: E402
from models.data import ProceduralShapes  # noqa: E402
from models.dgcnn import KNN_BACKENDS, DGCNN, knn_graph  # noqa: E402

GPU_CONFIGS = ["pcops-eager-fp32", "torch-eager-fp32", "pcops-eager-bf16", "torch-eager-bf16",
               "pcops-compile-bf16", "torch-compile-bf16"]
CPU_CONFIGS = ["pcops-eager-fp32", "torch-eager-fp32"]


def parse_config(name):
    """'pcops|torch - eager|compile - fp32|bf16' -> (backend, compiled, bf16)."""
    parts = name.split("-")
    if len(parts) != 3 or parts[0] not in KNN_BACKENDS or parts[1] not in ("eager", "compile") \
            or parts[2] not in ("fp32", "bf16"):
        raise SystemExit(f"bad configuration {name!r}: pcops|torch - eager|compile - fp32|bf16")
    return parts[0], parts[1] == "compile", parts[2] == "bf16"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_config(name, args, device, xyz, labels):
    backend, compiled, bf16 = parse_config(name)
    torch.manual_seed(0)  # the same weights for every configuration
    model = DGCNN(40, k=args.k, knn_backend=backend).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    net = torch.compile(model, dynamic=False) if compiled else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def train_step():
        with autocast:
            logits = net(xyz)
        F.cross_entropy(logits.float(), labels, label_smoothing=0.2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {"config": name}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    train_step()
    sync(device)
    row["first call (s)"] = f"{time.perf_counter() - t:.1f}"
    row["train step (ms)"] = time_fn(train_step, device, warmup=args.warmup, reps=args.reps)
    if device.type == "cuda":
        row["peak mem (GB)"] = f"{torch.cuda.max_memory_allocated() / 2**30:.2f}"
    return row


def knn_alone(args, device, xyz):
    """Per EdgeConv: the input features of a forward pass (eval mode, fp32), the time of its kNN
    graph on each backend, and the share of points with the same neighbour set."""
    torch.manual_seed(0)
    model = DGCNN(40, k=args.k).to(device).eval()
    inputs = []
    hooks = [conv.register_forward_pre_hook(lambda mod, a: inputs.append(a[0].detach())) for conv in model.convs]
    with torch.inference_mode():
        model(xyz)
    for h in hooks:
        h.remove()
    rows = []
    for i, x in enumerate(inputs):
        times = {}
        graphs = {}
        for backend in KNN_BACKENDS:
            with torch.inference_mode():
                graphs[backend] = knn_graph(x, args.k, backend)
                times[backend] = time_fn(lambda: knn_graph(x, args.k, backend), device,
                                         warmup=args.warmup, reps=args.reps)
        same = (graphs["pcops"].sort(-1).values == graphs["torch"].sort(-1).values).all(-1).float().mean()
        rows.append([f"EdgeConv {i + 1}", x.shape[-1], fmt_ms(times["pcops"]), fmt_ms(times["torch"]),
                     f"{times['torch'] / times['pcops']:.2f}x", f"{100 * same.item():.2f}%"])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--points", type=int, default=1024)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--configs", nargs="+", default=None,
                   help=f"default: {' '.join(GPU_CONFIGS)} (CPU: {' '.join(CPU_CONFIGS)})")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--time-limit", type=float, default=300.0,
                   help="skip the configurations not started within this many seconds (compilation is slow)")
    p.add_argument("--quick", action="store_true", help="smoke run: B=4, N=256, few repetitions")
    p.add_argument("--out", default=None, help="append the tables to this file")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.batch, args.points, args.warmup, args.reps = 4, 256, 1, 3
    configs = args.configs or (GPU_CONFIGS if device.type == "cuda" else CPU_CONFIGS)
    for name in configs:
        parse_config(name)  # fail on a typo before anything runs
    if device.type == "cuda" and args.tf32:
        torch.set_float32_matmul_precision("high")

    shapes = ProceduralShapes(args.batch, args.points, seed=0).materialize()
    xyz = shapes.points.to(device)
    labels = torch.randint(0, 40, (args.batch,), generator=torch.Generator().manual_seed(0)).to(device)

    header = environment_header()
    header.append(f"DGCNN (k={args.k}, EdgeConv 64-64-128-256, 1024, head 512-256-40), B={args.batch}, "
                  f"N={args.points}, SGD, TF32 {'on' if args.tf32 else 'off'}, warm-up {args.warmup}, "
                  f"median of {args.reps}")
    print("\n".join(header), flush=True)
    rows, t_start = [], time.perf_counter()
    for name in configs:
        if time.perf_counter() - t_start > args.time_limit:
            print(f"{name}: skipped (--time-limit {args.time_limit:g} s reached)", flush=True)
            rows.append({"config": name + " (skipped)"})
            continue
        try:
            row = run_config(name, args, device, xyz, labels)
        except Exception as e:  # one failing configuration (e.g. compilation) must not hide the others
            print(f"{name}: FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            rows.append({"config": name + " (failed)"})
            continue
        print(f"{name}: train step {fmt_ms(row['train step (ms)'])} ms", flush=True)
        rows.append(row)
    # each pcops row against the torch row of the same precision and compilation
    by_name = {r["config"]: r for r in rows if "train step (ms)" in r}
    cols = ["config", "train step (ms)", "vs torch kNN", "first call (s)"]
    cols += ["peak mem (GB)"] if device.type == "cuda" else []
    table = []
    for r in rows:
        if "train step (ms)" not in r:
            table.append([r["config"]] + ["-"] * (len(cols) - 1))
            continue
        twin = by_name.get("torch" + r["config"][len(r["config"].split("-")[0]):])
        speedup = f"{twin['train step (ms)'] / r['train step (ms)']:.2f}x" if twin else "-"
        table.append([r["config"], fmt_ms(r["train step (ms)"]), speedup, r["first call (s)"]]
                     + ([r["peak mem (GB)"]] if device.type == "cuda" else []))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(header) + "\n\n")
    print_table("DGCNN training step, kNN graphs on pcops vs plain torch", cols, table, file=args.out)
    print_table(f"the four kNN graphs alone (inference, fp32, B={args.batch}, N={args.points}, k={args.k})",
                ["layer", "D", "pcops (ms)", "torch (ms)", "speedup", "same neighbour sets"],
                knn_alone(args, device, xyz), file=args.out)


if __name__ == "__main__":
    main()
