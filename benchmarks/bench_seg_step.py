"""PointNet++ segmentation on pcops: time of a training step and of an inference step.

    python benchmarks/bench_seg_step.py                          # SEG_SSG, B=16, N=4096, GPU
    python benchmarks/bench_seg_step.py --model part-ssg --points 2048 --batch 32
    python benchmarks/bench_seg_step.py --quick                  # CPU smoke run

Training step = forward + cross-entropy over every point + backward + Adam step + zero_grad
(eager, fp32 with TF32 matmuls, or --bf16 autocast). Inference = eval mode under
torch.inference_mode. Medians of CUDA-event timings (perf_counter on the CPU) after warm-up.
Inputs: random points in the unit cube labelled by quadrant. Beside the classifier's numbers
(benchmarks/bench_train_step.py, helper "models").
"""
import contextlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import base_parser, environment_header, fmt_ms, print_table, time_fn  # noqa: E402
from models.pointnet2_seg import SEG_MODELS, build_seg_model  # noqa: E402


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="seg-ssg", choices=sorted(SEG_MODELS))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--points", type=int, default=4096)
    p.add_argument("--classes", type=int, default=13)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    if args.quick:
        args.model, args.batch, args.points, args.reps = "seg-ssg-lite", 2, 256, 3
    dev = args.device
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    cats = 16 if args.model == "part-ssg" else 0
    model = build_seg_model(args.model, args.classes, num_categories=cats).to(dev)
    step_model = torch.compile(model) if args.compile else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xyz = torch.rand(args.batch, args.points, 3, device=dev)
    labels = ((xyz[..., 0] > 0.5).long() + 2 * (xyz[..., 1] > 0.5).long()) % args.classes
    category = torch.zeros(args.batch, dtype=torch.long, device=dev) if cats else None
    autocast = (torch.autocast(device_type="cuda" if dev.startswith("cuda") else "cpu",
                               dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext())

    def train_step():
        with autocast:
            logits = step_model(xyz, None, category)
            loss = F.cross_entropy(logits.reshape(-1, args.classes).float(), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        with torch.inference_mode(), autocast:
            step_model(xyz, None, category)

    model.train()
    t_train = time_fn(train_step, dev, warmup=3, reps=args.reps)
    model.eval()
    t_infer = time_fn(infer_step, dev, warmup=3, reps=args.reps)
    print("\n".join(environment_header()))
    rows = [[args.model, args.batch, args.points, "bf16" if args.bf16 else "fp32",
             "yes" if args.compile else "no", fmt_ms(t_train), fmt_ms(t_infer),
             f"{args.batch * args.points / t_train:.1f}"]]
    print_table(f"PointNet++ segmentation step on {dev}",
                ["model", "B", "N", "dtype", "compile", "train ms", "infer ms", "kpts/s train"],
                rows, file=args.out)


if __name__ == "__main__":
    main()
