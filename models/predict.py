"""Classify point clouds with a checkpoint of models.train.

    python -m models.predict runs/mn40/best.pt scans/ chair.ply --csv predictions.csv
    python -m models.predict runs/mn40/best.pt cache.npz          # a pcops.preprocess cache

Inputs are files or folders of clouds (every format pcops.io reads: .npy/.npz, PLY, KITTI .bin,
PCD, LAS/LAZ; folders recursively) or caches written by `python -m pcops.preprocess` (an .npz
or a folder of shards: each cached cloud's FPS centres are classified). Each cloud is prepared as
the training data was: non-finite points dropped, centred on its mean and scaled into the unit
sphere, then reduced to the model's number of points by farthest point sampling (pcops; from
point 0, so the result is deterministic) or, if it has fewer, its points repeated in order.
Prints one line per cloud (input, class, probability, and the next --top classes) and writes them
as CSV with --csv. Inputs that cannot be read are listed at the end and make the exit code 1;
the others are still classified.
"""
import argparse
import csv
import os
import sys
from contextlib import nullcontext
from typing import List, Tuple

import numpy as np
import torch

import pcops
from pcops import io as pio

from models.checkpoint import load_model

__all__ = ["prepare_cloud", "collect_inputs", "predict", "main"]


def prepare_cloud(xyz: torch.Tensor, num_points: int, normalize: bool = True) -> torch.Tensor:
    """[N,3] -> [num_points,3] float32: finite rows only, centred on the mean and scaled into the
    unit sphere (if normalize), FPS-sampled to num_points (or repeated in order if N is smaller)."""
    xyz = xyz.float()
    xyz = xyz[torch.isfinite(xyz).all(dim=1)]
    if xyz.shape[0] == 0:
        raise ValueError("no finite points")
    if normalize:
        xyz = xyz - xyz.mean(dim=0)
        radius = xyz.norm(dim=1).max()
        if radius > 0:
            xyz = xyz / radius
    n = xyz.shape[0]
    if n >= num_points:
        idx = pcops.furthest_point_sample(xyz.unsqueeze(0), num_points)[0]
    else:
        idx = torch.arange(num_points, device=xyz.device) % n
    return xyz[idx]


def _is_cache(path: str) -> bool:
    """A preprocess cache: a folder with shard_*.npz files, or an .npz holding 'centres'."""
    if os.path.isdir(path):
        return bool(pio.cache_shards(path))
    if path.lower().endswith(".npz") and os.path.isfile(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                return "centres" in z.files and "settings" in z.files
        except Exception:  # noqa: BLE001 (read_cloud will say what is wrong with it)
            return False
    return False


def collect_inputs(inputs, num_points: int, device) -> Tuple[List[str], List[torch.Tensor], List[Tuple[str, str]]]:
    """-> (names, prepared clouds [num_points,3] on device, failures [(input, reason)])."""
    names, clouds, failed = [], [], []
    files = []
    for item in inputs:
        if _is_cache(item):
            try:
                cache = pio.read_cache(item)
            except pio.CloudReadError as e:
                failed.append((item, str(e)))
                continue
            normalized = bool(cache.settings.get("normalize", False))
            for b in range(len(cache)):
                n = int(cache.lengths[b])
                centres = torch.from_numpy(np.asarray(cache.centres[b, :n])).to(device)
                name = f"{item}:{cache.sources[b]}"
                try:
                    # normalised caches hold the centres in the normalised frame of the whole cloud
                    clouds.append(prepare_cloud(centres, num_points, normalize=not normalized))
                    names.append(name)
                except ValueError as e:
                    failed.append((name, str(e)))
        else:
            files += pio.find_clouds(item)
    for path in files:
        try:
            cloud = pio.read_cloud(path, nan="drop")
            clouds.append(prepare_cloud(torch.from_numpy(cloud.xyz).to(device), num_points))
            names.append(path)
        except (pio.CloudReadError, ValueError) as e:
            failed.append((path, str(e).removeprefix(f"{path}: ")))
    return names, clouds, failed


@torch.inference_mode()
def predict(model, clouds: List[torch.Tensor], batch_size: int = 32, autocast=nullcontext()) -> torch.Tensor:
    """Class probabilities [len(clouds), K] (float32, on the CPU) of prepared clouds."""
    out = []
    for i in range(0, len(clouds), batch_size):
        xyz = torch.stack(clouds[i:i + batch_size])
        with autocast:
            logits = model(xyz).float()
        out.append(logits.softmax(dim=1).cpu())
    return torch.cat(out) if out else torch.zeros(0, 0)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m models.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a best.pt or last.pt written by models.train")
    p.add_argument("inputs", nargs="+", help="cloud files, folders of them, or pcops.preprocess caches")
    p.add_argument("--csv", default=None, help="write input,class,probability[,class_2,probability_2,...] here")
    p.add_argument("--top", type=int, default=1, help="classes listed per input (most probable first)")
    p.add_argument("--points", type=int, default=None, help="points per cloud (default: the checkpoint's)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--amp", default="auto", choices=["auto", "bf16", "none"], help="bf16 autocast (auto: on CUDA)")
    return p


def main(argv=None) -> int:
    """The prediction command -> exit code (0, or 1 if some input failed, 2 for set-up errors)."""
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    amp = args.amp if args.amp != "auto" else ("bf16" if device.type == "cuda" else "none")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp == "bf16" else nullcontext()
    try:
        model, spec = load_model(args.checkpoint, device)
    except ValueError as e:
        print(f"models.predict: {e}", file=sys.stderr)
        return 2
    points = args.points or spec["points"]
    names, clouds, failed = collect_inputs(args.inputs, points, device)
    probs = predict(model, clouds, args.batch_size, autocast)
    top = max(1, min(args.top, spec["num_classes"]))
    rows = []
    for name, p in zip(names, probs):
        values, idx = p.topk(top)
        row = [name]
        for v, i in zip(values.tolist(), idx.tolist()):
            row += [spec["classes"][i], f"{v:.4f}"]
        rows.append(row)
        print("  ".join(row))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            head = ["input", "class", "probability"]
            for k in range(2, top + 1):
                head += [f"class_{k}", f"probability_{k}"]
            w.writerow(head)
            w.writerows(rows)
    print(f"{len(rows)} cloud(s) classified with {args.checkpoint} ({spec['name']}, {points} points, {device})"
          + (f", written to {args.csv}" if args.csv else ""), file=sys.stderr)
    if failed:
        print(f"{len(failed)} input(s) failed:", file=sys.stderr)
        for name, why in failed:
            print(f"  {name}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
