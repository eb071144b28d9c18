"""Checkpoints of models.train, and the one way to load a model from them (used by the training
command's --resume, models.evaluate and models.predict).

A checkpoint is a dict saved with torch.save: model (state dict), config (the training command's
settings as given: --resume restores them), classes, epoch, and for last.pt also the optimizer,
EMA, best, best_epoch, planned_epochs and history. Checkpoints written since the models/ split
also hold `spec`: what it takes to rebuild the model without the training data (model name,
number of classes, grouping, head dropout, points per shape, the training augmentation; for
DGCNN also k and the kNN backend).
"""
import os
from typing import Optional, Tuple

import torch

from torch import nn

from .classifiers import build_classifier

__all__ = ["save_checkpoint", "load_checkpoint", "model_spec", "load_model"]


def save_checkpoint(path: str, obj: dict) -> None:
    """torch.save to path.tmp, then an atomic rename: never a half-written checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """The checkpoint dict (tensors on the CPU); ValueError naming the file if it is not one of
    models.train's checkpoints."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise ValueError(f"{path}: no such checkpoint file") from e
    except Exception as e:  # noqa: BLE001 (pickle, zip and torch errors alike)
        raise ValueError(f"{path}: cannot read as a torch checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path}: not a checkpoint of models.train (expected keys 'model' and 'config', got {keys})")
    return ckpt


def model_spec(ckpt: dict) -> dict:
    """{name, num_classes, grouping, dropout, points, classes, augment, k, knn_backend}: the
    checkpoint's `spec`, or for an older checkpoint, the same derived from its config and weights
    (k and knn_backend are read by DGCNN only; checkpoints without them get the defaults)."""
    if "spec" in ckpt:
        return {"k": 20, "knn_backend": "pcops", **ckpt["spec"]}
    cfg, state = ckpt["config"], ckpt["model"]
    name = cfg.get("model") or ("ssg-lite" if cfg.get("data") == "builtin" else "ssg")
    num_classes = state["head.8.weight"].shape[0]
    classes = ckpt.get("classes") or [str(i) for i in range(num_classes)]
    points = cfg.get("points") or (256 if cfg.get("data") == "builtin" else 1024)
    return dict(name=name, num_classes=num_classes, grouping=cfg.get("grouping", "ball"),
                dropout=cfg.get("dropout", 0.5), points=points, classes=list(classes),
                augment=augment_settings(cfg), k=cfg.get("k", 20), knn_backend=cfg.get("knn_backend", "pcops"))


def augment_settings(cfg: dict) -> dict:
    """The training augmentation of a config, as keyword arguments of models.augment.Augment."""
    scale = cfg.get("aug_scale", [0.8, 1.25])
    sigma = cfg.get("aug_jitter", 0.01)
    return dict(scale=tuple(scale) if scale and scale[1] > 0 else None, shift=cfg.get("aug_shift", 0.1),
                rotate=cfg.get("aug_rotate", False), up_axis=cfg.get("up_axis", 1),
                jitter=(sigma, 5 * sigma) if sigma > 0 else None, dropout=cfg.get("aug_dropout", 0.0))


def load_model(ckpt, device="cpu") -> Tuple[nn.Module, dict]:
    """(model in eval mode on device, spec) from a checkpoint path or dict."""
    path: Optional[str] = ckpt if isinstance(ckpt, str) else None
    if path is not None:
        ckpt = load_checkpoint(path)
    spec = model_spec(ckpt)
    model = build_classifier(spec["name"], spec["num_classes"], grouping=spec["grouping"], dropout=spec["dropout"],
                             k=spec["k"], knn_backend=spec["knn_backend"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"{path or 'checkpoint'}: its weights do not fit a {spec['name']} model "
                         f"({str(e).splitlines()[0]})") from e
    return model.to(device).eval(), spec
