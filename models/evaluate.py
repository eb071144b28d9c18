"""Score a checkpoint of models.train on a labelled ModelNet40 set, with test-time voting.

    python -m models.evaluate runs/mn40/last.pt --data ../shared/data/modelnet40_train.npz
    python -m models.evaluate runs/mn40/best.pt --data modelnet40_ply_hdf5_2048/ --votes 10

Prints overall and mean-class accuracy and the accuracy of every class, writes a confusion
matrix PNG (and the numbers as JSON). Voting: V copies of each shape, copy 0 as evaluated during
training (its first N points), copies 1..V-1 a random subset of N of its points with the
training augmentations that keep the label (scale, shift, rotation about the up axis if the run
used it, jitter; not point dropout); the logits of the copies are averaged. All randomness comes
from --seed, so a run repeats exactly on the same machine.
"""
import argparse
import json
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["confusion_matrix", "accuracies", "evaluate", "main"]


@torch.inference_mode()
def confusion_matrix(model, loader, num_classes, autocast=nullcontext(), ddp=False, votes=1, augment=None,
                     generator=None):
    """Counts [K,K] (int64, on the CPU): row = true class, column = predicted class, over the
    valid rows of an evaluation DeviceLoader; counted on the device, read once (all-reduced
    over the processes if ddp). votes > 1 averages the logits of that many copies per shape
    (DeviceLoader.vote_batches)."""
    model.eval()
    dev = loader.data.points.device
    K = num_classes
    conf = torch.zeros(K * K, dtype=torch.long, device=dev)
    batches = loader if votes <= 1 else loader.vote_batches(votes, augment, generator)
    for xyz, labels, valid in batches:
        copies = [xyz] if votes <= 1 else xyz
        logits = None
        for x in copies:
            with autocast:
                out = model(x).float()
            logits = out if logits is None else logits + out
        pred = logits.argmax(dim=1)
        cell = F.one_hot(labels * K + pred, K * K) * valid.unsqueeze(1)   # [B,K*K], padding rows zero
        conf += cell.sum(0)
    if ddp:
        dist.all_reduce(conf)
    return conf.view(K, K).cpu()


def accuracies(conf):
    """(overall accuracy, mean class accuracy, per-class accuracy [K] with NaN for absent
    classes), in %, from a confusion matrix."""
    conf = conf.double()
    correct, total = conf.diagonal(), conf.sum(1)
    seen = total > 0
    oa = 100.0 * correct.sum().item() / max(1.0, total.sum().item())
    macc = 100.0 * (correct[seen] / total[seen]).mean().item() if seen.any() else 0.0
    per_class = torch.where(seen, 100.0 * correct / total.clamp(min=1), torch.full_like(total, float("nan")))
    return oa, macc, per_class


def evaluate(model, loader, num_classes, autocast, ddp, votes=1, augment=None, generator=None):
    """(overall accuracy, mean class accuracy) in %: what the training command logs every epoch."""
    conf = confusion_matrix(model, loader, num_classes, autocast, ddp, votes, augment, generator)
    return accuracies(conf)[:2]


def plot_confusion(conf, classes, path, title):
    """The confusion matrix as a PNG, rows normalised to the true class's shapes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    K = len(classes)
    rows = conf.double() / conf.sum(1, keepdim=True).clamp(min=1)
    size = max(5.0, 0.22 * K + 2.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    im = ax.imshow(rows.numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(K))
    ax.set_yticks(range(K))
    fs = 7 if K > 20 else 9
    ax.set_xticklabels(classes, rotation=90, fontsize=fs)
    ax.set_yticklabels(classes, fontsize=fs)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m models.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a best.pt or last.pt written by models.train")
    p.add_argument("--data", default=None,
                   help="'builtin', a ModelNet40 .npz, a folder of ply_data_*.h5 or a modelnet40_normal_resampled "
                        "folder (default: the data the checkpoint was trained on)")
    p.add_argument("--split", default=None,
                   help="npz: val (default), train, all; folders: test (default), train; builtin: val (default), "
                        "train, test")
    p.add_argument("--votes", type=int, default=1, help="copies per shape whose logits are averaged (1: no voting)")
    p.add_argument("--points", type=int, default=None, help="points per shape (default: the checkpoint's)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="seed of the voting copies")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--amp", default="auto", choices=["auto", "bf16", "none"], help="bf16 autocast (auto: on CUDA)")
    p.add_argument("--out", default=None, help="folder for confusion-<split>.png and eval-<split>.json "
                                               "(default: the checkpoint's folder)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    return p


def main(argv=None):
    """The evaluation command; returns the result dict (also written as JSON)."""
    from models.augment import Augment
    from models.checkpoint import load_checkpoint, load_model
    from models.data import load_split
    from models.loader import DeviceLoader

    args = build_parser().parse_args(argv)
    if args.votes < 1:
        raise SystemExit("--votes must be at least 1")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    amp = args.amp if args.amp != "auto" else ("bf16" if device.type == "cuda" else "none")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp == "bf16" else nullcontext()
    try:
        ckpt = load_checkpoint(args.checkpoint)
        model, spec = load_model(ckpt, device)
        cfg = ckpt["config"]
        spec_data = args.data or cfg.get("data", "builtin")
        points = args.points or spec["points"]
        data, split = load_split(spec_data, args.split, num_points=points, seed=cfg.get("seed", 0),
                                 num_shapes=cfg.get("num_val_shapes", 500) if (args.split or "val") == "val"
                                 else cfg.get("num_shapes", 2000))
    except (ValueError, OSError) as e:
        raise SystemExit(f"models.evaluate: {e}")
    if data.num_classes != spec["num_classes"]:
        raise SystemExit(f"models.evaluate: {spec_data} has {data.num_classes} classes, the checkpoint "
                         f"{spec['num_classes']}")
    points = min(points, data.points.shape[1])
    loader = DeviceLoader(data, args.batch_size, points, device, train=False)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    augment = Augment(**{**spec["augment"], "dropout": 0.0})
    conf = confusion_matrix(model, loader, spec["num_classes"], autocast, votes=args.votes, augment=augment,
                            generator=gen)
    oa, macc, per_class = accuracies(conf)
    classes = spec["classes"]
    print(f"{args.checkpoint}: {spec['name']} on {spec_data} ({split} split, {len(data)} shapes, {points} points), "
          f"{args.votes} vote(s), {amp if amp == 'bf16' else 'fp32'}, seed {args.seed}, {device}")
    width = max(len(c) for c in classes)
    total = conf.sum(1)
    for k, c in enumerate(classes):
        if total[k] > 0:
            print(f"  {c:<{width}}  {per_class[k].item():6.2f}%  ({int(conf[k, k])}/{int(total[k])})")
    print(f"overall accuracy {oa:.2f}%  mean class accuracy {macc:.2f}%  ({int(conf.diagonal().sum())}/"
          f"{int(conf.sum())} shapes)")
    out = args.out or os.path.dirname(os.path.abspath(args.checkpoint))
    os.makedirs(out, exist_ok=True)
    result = dict(checkpoint=args.checkpoint, data=spec_data, split=split, shapes=len(data), points=points,
                  votes=args.votes, seed=args.seed, amp=amp, overall_acc=oa, mean_class_acc=macc,
                  per_class_acc={c: (None if total[k] == 0 else per_class[k].item()) for k, c in enumerate(classes)},
                  classes=classes, confusion=conf.tolist())
    with open(os.path.join(out, f"eval-{split}.json"), "w") as f:
        json.dump(result, f, indent=1)
    if not args.no_plot:
        png = os.path.join(out, f"confusion-{split}.png")
        plot_confusion(conf, classes, png, f"{os.path.basename(args.checkpoint)} on {split}: OA {oa:.2f}%, "
                                           f"mAcc {macc:.2f}%, {args.votes} vote(s)")
        print(f"wrote {png} and eval-{split}.json")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
