"""Training in several processes (torchrun, one GPU each, one or several machines) without
DistributedDataParallel: the training step stays the one-process step (compiled, captured as CUDA
graphs), and these functions keep the processes in step around it. The data split is the
loader's (models/loader.py: every process draws the global batch alike and keeps its rows).

- broadcast_tensors: rank 0's weights to everyone at the start (and after --resume)
- average_gradients: after each backward pass, before the optimizer step
- average_buffers:   BatchNorm running statistics and the EMA, after each epoch
- same_weights:      the check at the end of a run that nothing drifted
"""
import torch
import torch.distributed as dist

__all__ = ["broadcast_tensors", "average_gradients", "average_buffers", "same_weights"]


def broadcast_tensors(tensors, src=0):
    """Copy rank src's values of these tensors to every process, one broadcast per dtype."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src)
        parts = [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in group]), group)]
        with torch.no_grad():
            torch._foreach_copy_([t.detach() for t in group], parts)


def average_gradients(params, world):
    """Average .grad over the processes: one all-reduce of one flat buffer, whose slices become
    the parameters' .grad (no host sync; a parameter without a gradient counts as zero).

    This is what DistributedDataParallel does, without its autograd hooks: the training step
    (forward and backward, compiled and captured as CUDA graphs under reduce-overhead) is the
    one-process step unchanged, and the all-reduce runs between it and the optimizer step. The
    price is no overlap of the all-reduce with the backward pass: for the 1.5 M parameters of
    SSG (6 MB) that is tens of microseconds on NVLink."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world)
    for p, g in zip(params, flat.split([q.numel() for q in params])):
        p.grad = g.view_as(p)


@torch.no_grad()
def average_buffers(state, world):
    """Average the floating-point buffers (BatchNorm running statistics, which each process
    updates from its own rows) and the EMA over the processes, before evaluating and saving."""
    tensors = [b for b in state.model.buffers() if b.dtype.is_floating_point]
    if state.ema is not None:
        tensors += state.ema.shadow
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat.div_(world)
    torch._foreach_copy_(tensors, [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in tensors]), tensors)])


def same_weights(model) -> bool:
    """Whether every process holds rank 0's parameters and buffers bit for bit (checked once, at
    the end of a run)."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in model.state_dict().values()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    differs = torch.tensor([0.0 if torch.equal(ref, flat) else 1.0], device=flat.device)
    dist.all_reduce(differs)  # a sum (gloo reduces CUDA tensors with SUM and a few ops only)
    return differs.item() == 0.0
