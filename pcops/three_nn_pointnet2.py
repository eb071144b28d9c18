"""``three_nn_pointnet2``: pointnet2_ops's ``three_nn`` in one op (Euclidean distances, int32
indices), its fake (meta) implementation. No autograd: the Autograd key falls through
(pcops/_dispatch.py, no_autograd), so inputs that require grad are accepted and the
outputs carry no graph. Called by :func:`pcops.compat.pointnet2_ops.three_nn`;
:func:`pcops.three_nn` is the native form (squared distances, int64, differentiable)."""
import torch

from . import _autograd, _checks
from ._dispatch import no_autograd as _no_autograd


@torch.library.register_fake("pcops::three_nn_pointnet2")
def _three_nn_pointnet2_fake(unknown, known):
    _checks.check_devices("three_nn_pointnet2", "unknown", unknown, known=known)
    torch._check(unknown.dim() == 3 and unknown.shape[2] == 3,
                 lambda: "unknown must be [B, n, 3]")
    torch._check(known.dim() == 3 and known.shape[2] == 3, lambda: "known must be [B, m, 3]")
    torch._check(known.dtype == unknown.dtype, lambda: "known must have the dtype of unknown")
    torch._check(known.shape[0] == unknown.shape[0], lambda: "unknown and known differ in B")
    shape = (unknown.shape[0], unknown.shape[1], 3)
    return unknown.new_empty(shape), unknown.new_empty(shape, dtype=torch.int32)


_autograd.register_fold_vmap("three_nn_pointnet2", batched=(0, 1))


_no_autograd("three_nn_pointnet2")
