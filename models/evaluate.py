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
