"""Helpers shared by the compat modules."""
from torch import Tensor


def nograd(t: Tensor) -> Tensor:
    """t without autograd history, for an op whose output is not differentiated: a detach only
    where there is history (otherwise no dispatch at all; the shims count their dispatches)."""
    return t.detach() if t.requires_grad else t
