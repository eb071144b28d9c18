"""Train a PointNet++ or DGCNN classifier whose sampling, neighbour search and grouping run on pcops.

    python -m models.train                                  # built-in shapes: a few minutes on a CPU
    python -m models.train --data ../shared/data/modelnet40_train.npz --epochs 150 --compile
    python -m models.train --preset modelnet40-h100 --out runs/mn40   # the 5-minute H100 run
    python -m models.train --preset modelnet40-dgcnn --out runs/dgcnn # DGCNN, the paper's 250 epochs
    torchrun --nproc_per_node 4 -m models.train --preset modelnet40-h100   # the same on 4 GPUs
    python -m models.train --resume runs/mn40/last.pt       # continue a run where it stopped

One process or many: under torchrun (RANK / WORLD_SIZE set; NCCL on GPUs, gloo on CPUs) every
process runs the same training step as one process would (compiled, with CUDA graphs under
--compile-mode reduce-overhead) on its rows of each global batch, then the gradients are averaged
by one all-reduce of a flat buffer before the optimizer step; --batch-size is per process
(--global-batch-size divides a global one), --lr-scaling adapts the learning rate to the global
batch. Several machines: torchrun's rendezvous (models/README.md has the command). The whole
data set lives on the device and is augmented there in batch; the step has no host
synchronisation: metrics are accumulated on the device and read every --log-every steps and once
per epoch.

Writes to --out: train.log, metrics.csv, curves.png, last.pt (model, optimizer, EMA, epoch, best,
config, history: --resume continues the same curve) and best.pt (the evaluated weights).
"""
import time

T0 = time.time()  # the run's clock starts before torch is imported

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models.checkpoint import augment_settings, save_checkpoint  # noqa: E402
from models.data import Augment, DeviceLoader, load_data  # noqa: E402
from models.distributed import average_buffers, average_gradients, broadcast_tensors, same_weights  # noqa: E402
from models.evaluate import evaluate  # noqa: E402
from models.history import plot_curves, write_metrics  # noqa: E402
from models.optim import EMA, epochs_within_budget, lr_at, make_optimizer  # noqa: E402
from models.classifiers import CLASSIFIERS, build_classifier, describe  # noqa: E402

try:
    from tqdm import tqdm
except ImportError:  # progress bars are a nicety
    tqdm = None

__all__ = ["PRESETS", "build_parser", "parse_args", "main", "train", "epochs_within_budget", "lr_at", "evaluate"]


def _default_npz():
    for path in (".data/modelnet40_train.npz", "shared/data/modelnet40_train.npz",
                 "../shared/data/modelnet40_train.npz"):
        if os.path.exists(path):
            return path
    return "../shared/data/modelnet40_train.npz"


# Presets set defaults; flags given on the command line still win.
PRESETS = {
    # PointNet++ SSG on the ModelNet40 npz (train on the non-val shapes, evaluate on val): the
    # recipe measured on the GPU; models/README.md ("The ModelNet40 preset") says how it was
    # tuned and what each setting is for. --time-budget is a guard: on a slower GPU or host the
    # epochs are cut to what fits and the cosine schedule is laid over them.
    "modelnet40-h100": dict(
        data=_default_npz(), model="ssg", points=736, epochs=130, time_budget=280.0,
        batch_size=32, eval_batch_size=128, optimizer="adamw", lr=1e-3, weight_decay=0.05,
        warmup_epochs=2.0, min_lr_ratio=0.0, label_smoothing=0.2, grad_clip=1.0,
        aug_scale=[2 / 3, 1.5], aug_shift=0.2, aug_jitter=0.01, aug_rotate=False,
        amp="bf16", compile=True, compile_mode="reduce-overhead", compile_eval=False, save_every=25,
        # the lr above is for a global batch of 32 (one GPU); with more GPUs (batch 32 each) it
        # grows with the square root of the global batch (the rule for Adam-type optimizers):
        # one GPU runs exactly as measured
        lr_scaling="sqrt", lr_batch=32,
    ),
    # DGCNN (Wang et al. 2019) on the same npz, the paper's recipe (its section 4.1 and its
    # authors' reference code): SGD lr 0.1, momentum 0.9 (not Nesterov), weight decay 1e-4,
    # cosine annealing to 0.001 over 250 epochs, batch 32, head dropout 0.5, k = 20, label
    # smoothing 0.2, anisotropic scale in [2/3, 3/2] and shift 0.2 (no jitter, no rotation),
    # the points in a new random order each time a shape is drawn. Departures: 736 points per
    # shape (all the npz stores; the paper samples 1024), and bf16 autocast on CUDA (the
    # reference code runs in float32).
    # Measured on an H200 cut to 420 s: models/README.md, "DGCNN results".
    "modelnet40-dgcnn": dict(
        data=_default_npz(), model="dgcnn", k=20, knn_backend="pcops", points=736, epochs=250,
        batch_size=32, eval_batch_size=64, optimizer="sgd", lr=0.1, momentum=0.9, nesterov=False,
        weight_decay=1e-4, warmup_epochs=0.0, min_lr_ratio=0.01, label_smoothing=0.2, grad_clip=0.0,
        dropout=0.5, aug_scale=[2 / 3, 1.5], aug_shift=0.2, aug_jitter=0.0, aug_rotate=False,
        amp="bf16", compile=False, save_every=25,
        # SGD: the lr grows linearly with the global batch under torchrun (one GPU: as above)
        lr_scaling="linear", lr_batch=32,
    ),
}
# The same recipe cut to a time budget: after epoch 2 the number of epochs is cut to what fits
# in 450 s (start to final evaluation) and the cosine schedule is laid over them. A short run
# to compare with the PointNet++ preset on one GPU, not the paper's recipe.
PRESETS["modelnet40-dgcnn-8min"] = dict(PRESETS["modelnet40-dgcnn"], time_budget=450.0)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m models.train", description=__doc__,
                                epilog="The defaults are sized for the built-in data on a CPU (a few minutes); "
                                       "see --preset for ModelNet40.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--preset", choices=sorted(PRESETS), help="a named configuration (flags still override it)")
    g = p.add_argument_group("data")
    g.add_argument("--data", default="builtin",
                   help="'builtin' (procedural shapes), a ModelNet40 .npz, a folder of ply_data_*.h5 "
                        "or a modelnet40_normal_resampled folder")
    g.add_argument("--points", type=int, default=None,
                   help="points per shape (default: 256 for builtin, 1024 for the text layout, "
                        "all stored points for npz / HDF5)")
    g.add_argument("--num-shapes", type=int, default=2000, help="builtin: training shapes")
    g.add_argument("--num-val-shapes", type=int, default=500, help="builtin: validation shapes")
    g.add_argument("--aug-scale", type=float, nargs=2, default=[0.8, 1.25], metavar=("LO", "HI"),
                   help="random anisotropic scale range (0 0 to disable)")
    g.add_argument("--aug-shift", type=float, default=0.1, help="random shift amount")
    g.add_argument("--aug-jitter", type=float, default=0.01, help="jitter sigma (clipped at 5 sigma)")
    g.add_argument("--aug-rotate", action=argparse.BooleanOptionalAction, default=False,
                   help="random rotation about the up axis")
    g.add_argument("--up-axis", type=int, default=1, choices=[1, 2], help="1 = y (ModelNet40 files), 2 = z")
    g.add_argument("--aug-dropout", type=float, default=0.0, help="max ratio of random point dropout")
    g.add_argument("--train-points", type=int, default=None,
                   help="points per training sample, a fresh random subset of the stored points every "
                        "epoch (default: --points; fewer resamples each shape, evaluation keeps --points)")
    g.add_argument("--val-split", default="file", choices=["file", "none"],
                   help="file: the data's own validation split (npz: its val mask, folders: the test "
                        "split, builtin: the val stream); none: train on all shapes of the file (npz: "
                        "train + val), no validation")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, choices=list(CLASSIFIERS),
                   help="PointNet++ ssg / msg / ssg-lite, or dgcnn (default: ssg-lite (a small SSG) "
                        "for builtin, ssg for files)")
    g.add_argument("--grouping", default="ball", choices=["ball", "knn"], help="PointNet++ only")
    g.add_argument("--k", type=int, default=20, help="dgcnn: neighbours of every EdgeConv (paper: 20)")
    g.add_argument("--knn-backend", default="pcops", choices=["pcops", "torch"],
                   help="dgcnn: who builds the kNN graphs: pcops.knn, or the plain-torch matmul + topk "
                        "of DGCNN's reference code")
    g.add_argument("--dropout", type=float, default=0.5, help="dropout of the classifier head (paper: 0.5)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=10)
    g.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds from start to final evaluation: after epoch 2 the number of epochs "
                        "is cut to what fits, and cut again if later epochs run slower (0: off)")
    g.add_argument("--batch-size", type=int, default=16, help="per process")
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="split this batch over the processes (sets --batch-size to it / world size)")
    g.add_argument("--lr-scaling", default="none", choices=["none", "sqrt", "linear"],
                   help="scale --lr by (global batch / --lr-batch), its square root, or not at all")
    g.add_argument("--lr-batch", type=int, default=None,
                   help="the global batch --lr is meant for (default: --batch-size, one process)")
    g.add_argument("--eval-batch-size", type=int, default=None, help="default: 4 x batch size")
    g.add_argument("--optimizer", default="adamw", choices=["adamw", "adam", "sgd"])
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--weight-decay", type=float, default=1e-4)
    g.add_argument("--momentum", type=float, default=0.9, help="sgd only")
    g.add_argument("--nesterov", action=argparse.BooleanOptionalAction, default=True, help="sgd only")
    g.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up, then cosine decay")
    g.add_argument("--min-lr-ratio", type=float, default=0.01, help="final lr = lr x this")
    g.add_argument("--label-smoothing", type=float, default=0.0)
    g.add_argument("--grad-clip", type=float, default=0.0, help="max gradient norm (0: off)")
    g.add_argument("--ema", type=float, default=0.0, help="EMA decay of the weights used for evaluation (0: off)")
    g = p.add_argument_group("speed")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda")
    g.add_argument("--amp", default="auto", choices=["auto", "bf16", "none"],
                   help="bf16 autocast (auto: on CUDA only)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile the model")
    g.add_argument("--compile-eval", action=argparse.BooleanOptionalAction, default=True,
                   help="with --compile, also compile the evaluation (inference) graph")
    g.add_argument("--compile-mode", default="default",
                   help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    g.add_argument("--threads", type=int, default=1,
                   help="CPU threads of torch on a CPU device (default 1: this model's ops are too small "
                        "to gain from more, and on a busy machine more threads lose several-fold; scale "
                        "out with torchrun --nproc_per_node instead)")
    g.add_argument("--dist-backend", default="auto", choices=["auto", "nccl", "gloo"],
                   help="under torchrun (auto: nccl on GPUs, gloo on CPUs; gloo also lets several "
                        "processes share one GPU, for tests)")
    g.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                   help="TF32 matmuls for the fp32 parts on CUDA")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", default=None, help="output folder (default: runs/<model>-<time>)")
    g.add_argument("--resume", default=None, metavar="CKPT",
                   help="continue from a last.pt (its config, unless flags are given again)")
    g.add_argument("--final-votes", type=int, default=10,
                   help="at the end, evaluate the final weights with test-time voting over this many "
                        "copies per shape (models.evaluate's voting; 0 or 1: off)")
    g.add_argument("--save-every", type=int, default=1, help="write last.pt every this many epochs (and at the end)")
    g.add_argument("--log-every", type=int, default=50, help="steps between progress-bar updates (host syncs)")
    g.add_argument("--limit-steps", type=int, default=0, help="train steps per epoch (0: all; for smoke runs)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="tqdm progress bars (default: when stderr is a terminal)")
    return p


def parse_args(argv=None):
    """-> (config, checkpoint or None). Precedence: defaults < --preset < the checkpoint's config
    (--resume) < flags given on the command line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given_parser = build_parser()  # the same flags, but only those given end up in its namespace
    for action in given_parser._actions:
        action.default = argparse.SUPPRESS
    given = vars(given_parser.parse_args(argv))
    cfg = vars(parser.parse_args([]))
    if args.preset:
        cfg.update(PRESETS[args.preset])
    ckpt = None
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        cfg.update(ckpt["config"])
    cfg.update(given)
    return argparse.Namespace(**cfg), ckpt


# ---------------------------------------------------------------------------------------------
# setup: processes and devices, data, model and optimizer, compilation, output


def setup_processes(args):
    """torchrun sets RANK / WORLD_SIZE / LOCAL_RANK: one process per GPU (NCCL) or CPU (gloo).
    -> namespace(ddp, rank, world, local_rank, master, device, autocast)."""
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world, local_rank = 0, 1, 0
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if ddp:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":  # one GPU per process (modulo: gloo tests share one GPU)
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        backend = args.dist_backend if args.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and args.tf32:
        torch.set_float32_matmul_precision("high")
    if args.amp == "auto":
        args.amp = "bf16" if device.type == "cuda" else "none"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.amp == "bf16" else nullcontext()
    return SimpleNamespace(ddp=ddp, rank=rank, world=world, local_rank=local_rank, master=rank == 0,
                           device=device, autocast=autocast)


def batch_and_lr(args, world):
    """Per-process batch (from --global-batch-size if given) and the peak learning rate for the
    global batch (--lr-scaling) -> (batch per process, lr, description of the scaling)."""
    batch = args.batch_size
    if args.global_batch_size:
        if args.global_batch_size % world:
            raise SystemExit(f"--global-batch-size {args.global_batch_size} does not split over {world} processes")
        batch = args.global_batch_size // world
    ref = args.lr_batch or args.batch_size
    ratio = batch * world / ref
    factor = {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[args.lr_scaling]
    desc = "" if factor == 1.0 else f" ({args.lr:g} x {args.lr_scaling} of {batch * world}/{ref})"
    return batch, args.lr * factor, desc


def make_augment(args):
    return Augment(scale=tuple(args.aug_scale) if args.aug_scale[1] > 0 else None, shift=args.aug_shift,
                   rotate=args.aug_rotate, up_axis=args.up_axis,
                   jitter=(args.aug_jitter, 5 * args.aug_jitter) if args.aug_jitter > 0 else None,
                   dropout=args.aug_dropout)


def setup_data(args, run):
    """The data sets, the augmentation and the device loaders (this process's share; val None
    under --val-split none); resolves args.model and args.points where they were left to the data."""
    builtin = args.data == "builtin"
    if args.model is None:
        args.model = "ssg-lite" if builtin else "ssg"
    # --points picks how many points the built-in set generates and the text reader keeps; the
    # npz and HDF5 files are read whole
    points = args.points or (256 if builtin else 1024)
    train_set, val_set = load_data(args.data, num_points=points, seed=args.seed, num_shapes=args.num_shapes,
                                   num_val_shapes=args.num_val_shapes, val_split=args.val_split)
    if args.points is None:
        args.points = min(train_set.points.shape[1], val_set.points.shape[1] if val_set else 1 << 30)
    augment = make_augment(args)
    gen = torch.Generator(device=run.device)
    train_loader = DeviceLoader(train_set, run.batch_size, args.train_points or args.points, run.device, train=True,
                                augment=augment, generator=gen, rank=run.rank, world_size=run.world, seed=args.seed)
    val_loader = None
    if val_set is not None:
        val_loader = DeviceLoader(val_set, args.eval_batch_size or 4 * args.batch_size, args.points, run.device,
                                  train=False, rank=run.rank, world_size=run.world)
    steps = len(train_loader) if not args.limit_steps else min(args.limit_steps, len(train_loader))
    return SimpleNamespace(train_set=train_set, val_set=val_set, augment=augment, gen=gen, train=train_loader,
                           val=val_loader, steps_per_epoch=steps, num_classes=train_set.num_classes)


def checkpoint_spec(args, data):
    """What models.evaluate and models.predict need to rebuild the model (checkpoint 'spec')."""
    return dict(name=args.model, num_classes=data.num_classes, grouping=args.grouping, dropout=args.dropout,
                points=args.points, classes=list(data.train_set.classes), augment=augment_settings(vars(args)),
                k=args.k, knn_backend=args.knn_backend)


def setup_state(args, run, data, ckpt):
    """Model, optimizer, EMA and the progress counters, fresh or from a checkpoint (--resume);
    under torchrun, rank 0's weights and buffers are copied to all processes."""
    torch.manual_seed(args.seed)
    model = build_classifier(args.model, data.num_classes, grouping=args.grouping, dropout=args.dropout,
                             k=args.k, knn_backend=args.knn_backend).to(run.device)
    optimizer = make_optimizer(model, args, run.device)
    ema = EMA(model, args.ema) if args.ema > 0 else None
    state = SimpleNamespace(model=model, optimizer=optimizer, ema=ema, epoch=0, best=-1.0, best_epoch=0,
                            history=[], planned_epochs=args.epochs)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if ema is not None and ckpt.get("ema"):
            ema.load_state_dict(ckpt["ema"])
        state.epoch, state.best, state.best_epoch = ckpt["epoch"], ckpt["best"], ckpt["best_epoch"]
        state.history, state.planned_epochs = ckpt["history"], ckpt["planned_epochs"]
        if args.epochs != ckpt["config"]["epochs"]:  # --epochs given again: a new length (a new schedule)
            state.planned_epochs = args.epochs
    if run.ddp:
        tensors = list(model.state_dict().values()) + (ema.shadow if ema is not None else [])
        broadcast_tensors(tensors)
    return state


def first_line(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


class Nets:
    """The training and the evaluation network, compiled or not (--compile, --compile-eval,
    --compile-mode), the same under torchrun as in one process (gradients are averaged after the
    step: average_gradients). The first failure of a compiled network is logged and the work is
    redone with the raw model: a failure of the training network (compilation happens in the
    first step) switches both, one in evaluation only the evaluation network."""

    def __init__(self, raw, args, log):
        self.raw, self.log, self.mode = raw, log, args.compile_mode
        model = raw
        if args.compile:
            model = torch.compile(raw, mode=None if self.mode == "default" else self.mode, dynamic=False)
        self.eval = model if args.compile_eval else raw
        self.train = model
        self.compiled = args.compile

    def run_train(self, fn, on_failure):
        """fn(training network); on_failure() cleans up before the eager retry."""
        try:
            return fn(self.train)
        except Exception as e:  # noqa: BLE001
            if not self.compiled:
                raise
            self.log(f"WARNING: the compiled model failed ({first_line(e)}); continuing without torch.compile")
            on_failure()
            self.train, self.eval, self.compiled = self.raw, self.raw, False
            return fn(self.train)

    def run_eval(self, fn):
        try:
            return fn(self.eval)
        except Exception as e:  # noqa: BLE001
            if self.eval is self.raw:
                raise
            self.log(f"WARNING: the compiled model failed in evaluation ({first_line(e)}); "
                     "evaluating without torch.compile")
            self.eval = self.raw
            return fn(self.eval)


def open_log(args, run, config):
    """Resolves --out (rank 0 creates it) -> log(msg): print and append to train.log on rank 0."""
    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        args.out = os.path.dirname(args.resume) if args.resume else f"runs/{args.model}-{stamp}"
        config["out"] = args.out
    if run.master:
        os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "train.log"), "a") if run.master else None

    def log(msg):
        if log_file is not None:
            print(msg, flush=True)
            log_file.write(msg + "\n")
            log_file.flush()

    log.close = lambda: log_file.close() if log_file is not None else None
    return log


def log_header(log, args, run, data, nets, state, ckpt):
    n_params = sum(p.numel() for p in state.model.parameters())
    n_val = f"{len(data.val_set)} val" if data.val_set is not None else "no val (--val-split none)"
    name = describe(args.model, args.grouping, args.k, args.knn_backend)
    log(f"pcops {name[:-1]}, {n_params / 1e6:.2f} M parameters) on "
        f"{args.data}: {len(data.train_set)} train / {n_val} shapes, {data.num_classes} classes, "
        f"{args.points} points" + (f" ({args.train_points} in training)" if args.train_points else ""))
    compile_desc = "off"
    if args.compile:
        compile_desc = nets.mode + ("" if args.compile_eval else ", training only")
    log(f"device {run.device}{f' x {run.world} processes' if run.ddp else ''}, amp {args.amp}, "
        f"compile {compile_desc}, batch {run.batch_size}"
        f"{f' per process ({run.batch_size * run.world} total)' if run.ddp else ''}, "
        f"{data.steps_per_epoch} steps/epoch, "
        f"{args.optimizer} lr {run.lr:g}{run.lr_desc} wd {args.weight_decay:g}, {args.epochs} epochs"
        f"{f' (time budget {args.time_budget:g} s)' if args.time_budget else ''}, {data.augment}, "
        f"label smoothing {args.label_smoothing:g}, EMA {args.ema:g}, seed {args.seed}, out {args.out}")
    if ckpt is not None:
        log(f"resumed from {args.resume} after epoch {state.epoch} "
            f"(best val acc {state.best:.2f}% at epoch {state.best_epoch})")


# ---------------------------------------------------------------------------------------------
# one epoch, the time budget, checkpoints


def epoch_seed(seed, epoch, rank):
    """Every epoch reseeds all randomness from (seed, epoch, rank): a resumed run repeats it.
    The data and its augmentation draw from rank 0's seed in every process (they are drawn for
    the global batch), the model's own randomness (dropout) from the process's."""
    return (seed * 1_000_003 + epoch * 1009 + rank) % 2**63


def train_epoch(args, run, data, nets, state, show_progress):
    """One epoch of training steps -> (sum of loss x B, number correct, shapes seen, last lr),
    summed over the processes. The only host syncs: the progress bar every --log-every steps
    and the sums at the end."""
    epoch = state.epoch
    torch.manual_seed(epoch_seed(args.seed, epoch, run.rank))
    data.gen.manual_seed(epoch_seed(args.seed, epoch, 0))
    data.train.set_epoch(epoch)
    nets.train.train()
    steps = data.steps_per_epoch
    total_steps = state.planned_epochs * steps
    warmup_steps = round(args.warmup_epochs * steps)
    params = list(state.model.parameters())
    sums = torch.zeros(2, device=run.device)  # sum of loss * B, number correct
    seen, lr = 0, run.lr
    bar = tqdm(total=steps, desc=f"epoch {epoch + 1}/{state.planned_epochs}", leave=False,
               dynamic_ncols=True) if show_progress else None

    def forward_backward(net, xyz, labels):
        with run.autocast:
            logits = net(xyz)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=args.label_smoothing)
        loss.backward()
        return logits, loss

    for k, (xyz, labels, _) in enumerate(data.train):
        if k == steps:
            break
        lr = lr_at(epoch * steps + k, total_steps, warmup_steps, run.lr, args.min_lr_ratio)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        logits, loss = nets.run_train(lambda net: forward_backward(net, xyz, labels),
                                      lambda: state.optimizer.zero_grad(set_to_none=True))
        if run.ddp:
            average_gradients(params, run.world)
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        if state.ema is not None:
            state.ema.update()
        with torch.no_grad():
            sums += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum().float()])
        seen += len(labels)
        if bar is not None:
            bar.update()
            if (k + 1) % args.log_every == 0:  # the only host sync inside the epoch
                t = sums.tolist()
                bar.set_postfix(loss=f"{t[0] / seen:.3f}", acc=f"{100 * t[1] / seen:.1f}%", lr=f"{lr:.2e}")
    if bar is not None:
        bar.close()
    if run.ddp:
        dist.all_reduce(sums)
        seen *= run.world
        average_buffers(state, run.world)
    return sums.tolist() + [seen], lr


def evaluate_epoch(args, run, data, nets, state, votes=1):
    """Validation accuracy (overall, mean class) of the evaluated weights (the EMA if on), with
    test-time voting if votes > 1; (None, None) without validation data."""
    if data.val is None:
        return None, None
    gen = None
    if votes > 1:
        gen = torch.Generator(device=run.device)
        gen.manual_seed(args.seed)
    if state.ema is not None:
        state.ema.swap()
    try:
        return nets.run_eval(lambda net: evaluate(net, data.val, data.num_classes, run.autocast, run.ddp,
                                                  votes, data.augment.label_preserving(), gen))
    finally:
        if state.ema is not None:
            state.ema.swap()


def replan_for_budget(args, run, state, epoch_times, first_plan, log, reserve_s):
    """The time budget fixes the number of epochs once epoch 2 of this invocation (no
    compilation in it) is timed, and cuts it again whenever the recent epochs run slower than
    that (a busy host). Rank 0 decides for all."""
    fit, recent = epochs_within_budget(args.time_budget, time.time() - T0, epoch_times, state.epoch,
                                       state.planned_epochs, reserve_s)
    planned = torch.tensor([fit], device=run.device)  # NCCL: on the GPU
    if run.ddp:
        dist.broadcast(planned, 0)
    if first_plan:
        log(f"time budget {args.time_budget:g} s: {recent:.2f} s/epoch -> {int(planned)} epochs in total")
    elif int(planned) < state.planned_epochs:
        log(f"time budget {args.time_budget:g} s: epochs now take {recent:.2f} s -> "
            f"{int(planned)} epochs in total")
    state.planned_epochs = int(planned)


def save_checkpoints(args, data, state, config, spec, improved, val_acc):
    """best.pt (the evaluated weights) when validation improved, last.pt (everything --resume
    needs) every --save-every epochs and at the end; rank 0 only."""
    model, ema = state.model, state.ema
    if improved:
        if ema is not None:
            ema.swap()
        save_checkpoint(os.path.join(args.out, "best.pt"), dict(
            model=model.state_dict(), config=config, classes=data.train_set.classes, epoch=state.epoch,
            val_acc=val_acc, spec=spec))
        if ema is not None:
            ema.swap()
    if state.epoch % args.save_every == 0 or state.epoch >= state.planned_epochs:
        save_checkpoint(os.path.join(args.out, "last.pt"), dict(
            model=model.state_dict(), optimizer=state.optimizer.state_dict(),
            ema=ema.state_dict() if ema is not None else None, epoch=state.epoch, best=state.best,
            best_epoch=state.best_epoch, planned_epochs=state.planned_epochs, history=state.history, config=config,
            classes=data.train_set.classes, spec=spec))


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    """Parses the command line (argv, default sys.argv) and trains; returns the metrics history."""
    args, ckpt = parse_args(argv)
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        return train(args, ckpt)
    finally:  # train() may change these; leave in-process callers (tests) as they were
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)


def train(args, ckpt=None):
    config = dict(vars(args))  # as given: what a checkpoint stores and --resume restores
    run = setup_processes(args)
    run.batch_size, run.lr, run.lr_desc = batch_and_lr(args, run.world)
    data = setup_data(args, run)
    spec = checkpoint_spec(args, data)
    state = setup_state(args, run, data, ckpt)
    log = open_log(args, run, config)
    nets = Nets(state.model, args, log)
    log_header(log, args, run, data, nets, state, ckpt)
    show_progress = run.master and tqdm is not None and (sys.stderr.isatty() if args.progress is None
                                                         else args.progress)
    start_epoch = state.epoch
    epoch_times, eval_times, train_t0 = [], [], time.time()
    budget_planned = False  # whether this invocation fixed the number of epochs by --time-budget
    while state.epoch < state.planned_epochs:
        t_epoch = time.time()
        s, lr = train_epoch(args, run, data, nets, state, show_progress)
        train_time = time.time() - t_epoch
        val_acc, val_macc = evaluate_epoch(args, run, data, nets, state)
        eval_times.append(time.time() - t_epoch - train_time)
        state.epoch += 1
        dt = time.time() - t_epoch
        epoch_times.append(dt)
        state.history.append(dict(epoch=state.epoch, lr=lr, train_loss=s[0] / s[2], train_acc=100 * s[1] / s[2],
                                  val_acc=val_acc, val_mean_class_acc=val_macc, epoch_time_s=dt,
                                  elapsed_s=time.time() - T0))
        improved = val_acc is not None and val_acc > state.best
        if improved:
            state.best, state.best_epoch = val_acc, state.epoch
        val = (f"val acc {val_acc:5.2f}% mean class {val_macc:5.2f}% | best {state.best:5.2f}% ({state.best_epoch})"
               if val_acc is not None else "no val")
        log(f"epoch {state.epoch:3d}/{state.planned_epochs} | train loss {s[0] / s[2]:.4f} "
            f"acc {100 * s[1] / s[2]:5.2f}% | {val} | lr {lr:.2e} | {dt:5.2f} s "
            f"({s[2] / train_time:,.0f} shapes/s) | {time.time() - T0:6.1f} s")
        first_plan = (args.time_budget > 0 and state.epoch == start_epoch + 2
                      and state.planned_epochs == args.epochs)
        if first_plan or budget_planned:
            # kept free: 3 s for the final checkpoint and plot, and the final voting evaluation
            reserve = 3.0 + (max(0, args.final_votes - 1) * statistics.median(eval_times)
                                if data.val is not None else 0.0)
            replan_for_budget(args, run, state, epoch_times, first_plan, log, reserve)
            budget_planned = True
        if run.master:
            write_metrics(args.out, state.history)
            save_checkpoints(args, data, state, config, spec, improved, val_acc)

    if run.ddp and epoch_times:
        log(f"weights identical in the {run.world} processes: {'yes' if same_weights(state.model) else 'NO'}")
    voted = None
    if state.history and epoch_times and args.final_votes > 1 and data.val is not None:
        voted = evaluate_epoch(args, run, data, nets, state, votes=args.final_votes)
    if run.master and state.history:
        summarize(args, state, epoch_times, train_t0, voted, log)
    log.close()
    if run.ddp:
        # the ranks tear the group down together: rank 0 writes the summary and plot first, and
        # a rank that destroys a gloo group its peer still uses can abort ("terminate called
        # without an active exception", seen once in CI)
        dist.barrier()
        dist.destroy_process_group()
    return state.history


def summarize(args, state, epoch_times, train_t0, voted, log):
    history = state.history
    plot_curves(args.out, history, f"{describe(args.model, args.grouping, args.k, args.knn_backend)} on pcops: "
                                   f"{os.path.basename(args.data)}")
    times = epoch_times[1:] or epoch_times
    first = " (with compilation)" if args.compile else ""
    log(f"epoch time: median {statistics.median(times):.2f} s, first{first} {epoch_times[0]:.2f} s"
        if epoch_times else "no epoch run in this invocation")
    final = history[-1]
    if final["val_acc"] is None:
        log(f"done: {len(history)} epochs, training {time.time() - train_t0:.1f} s, "
            f"total wall {time.time() - T0:.1f} s | final train acc {final['train_acc']:.2f}% (no validation) | "
            f"{args.out}")
        return
    if voted is not None:
        log(f"final weights with test-time voting ({args.final_votes} copies per shape): val acc {voted[0]:.2f}% "
            f"(mean class {voted[1]:.2f}%), without voting {final['val_acc']:.2f}%")
    last10 = [h["val_acc"] for h in history[-10:]]
    log(f"done: {len(history)} epochs, training {time.time() - train_t0:.1f} s, "
        f"total wall {time.time() - T0:.1f} s | val acc final {final['val_acc']:.2f}% "
        f"(mean class {final['val_mean_class_acc']:.2f}%), last-{len(last10)} average "
        f"{statistics.mean(last10):.2f}%, best {state.best:.2f}% (epoch {state.best_epoch})"
        + (f", with voting {voted[0]:.2f}%" if voted is not None else "") + f" | {args.out}")


if __name__ == "__main__":
    main()
