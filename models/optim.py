"""Optimisation pieces of the training command: the optimizer with its weight-decay groups, the
learning-rate schedule, the EMA of the weights and the time-budget estimate."""
import math
import statistics

import torch

__all__ = ["make_optimizer", "lr_at", "EMA", "epochs_within_budget"]


def make_optimizer(model, args, device):
    # weight decay on the Linear weights only, not on BatchNorm or biases
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if device.type == "cuda" else {}
    if args.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=args.lr, **fused)
    if args.optimizer == "adam":
        return torch.optim.Adam(groups, lr=args.lr, **fused)
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, nesterov=getattr(args, "nesterov", True))


def lr_at(step, total_steps, warmup_steps, lr, min_ratio):
    """Linear warm-up from lr / warmup_steps to lr, then a cosine decay to lr * min_ratio."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def epochs_within_budget(budget_s, elapsed_s, epoch_times, epoch, planned, reserve_s=3.0):
    """-> (epochs in total, estimated seconds per epoch): how many epochs fit in `budget_s` from
    the start, `elapsed_s` having passed after `epoch` epochs. The estimate is the median of the
    last 10 of `epoch_times` (this invocation's, the first left out: it compiles), plus 3%;
    `reserve_s` is kept for the final checkpoint and plot. Never more than `planned` epochs,
    never fewer than `epoch`."""
    per_epoch = statistics.median(epoch_times[1:][-10:])
    fit = epoch + max(0, int((budget_s - reserve_s - elapsed_s) / (1.03 * per_epoch)))
    return min(planned, fit), per_epoch


class EMA:
    """An exponential moving average of a model's floating-point parameters and buffers (the
    BatchNorm statistics too), swapped in for evaluation. decay warms up as (1 + t) / (10 + t)."""

    def __init__(self, model, decay):
        self.decay, self.updates = decay, 0
        self.tensors = [t for t in model.state_dict().values() if t.dtype.is_floating_point]
        self.shadow = [t.detach().clone() for t in self.tensors]

    @torch.no_grad()
    def update(self):
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.shadow, self.tensors, 1 - d)

    @torch.no_grad()
    def swap(self):
        """Exchange the model's weights with the averaged ones (call again to swap back)."""
        for t, s in zip(self.tensors, self.shadow):
            tmp = t.clone()
            t.copy_(s)
            s.copy_(tmp)

    def state_dict(self):
        return {"updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state):
        self.updates = state["updates"]
        for s, v in zip(self.shadow, state["shadow"]):
            s.copy_(v)
