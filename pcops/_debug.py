"""Debug mode of the value checks of index inputs (see :func:`set_debug_checks`)."""
import torch

__all__ = ["set_debug_checks"]


def set_debug_checks(enabled: bool) -> bool:
    """Turns the value checks of index inputs on CUDA on or off; returns the previous setting.

    pcops always checks shapes, dtypes, devices and sizes, which costs no device read. The
    *values* of index inputs -- ``idx`` of :func:`pcops.group` / :func:`pcops.group_backward`
    in ``[-1, N)``, ``lengths`` in ``[0, N]``, FPS's ``start`` in ``[0, lengths[b])`` -- are
    checked exactly on the CPU, always, by the ops themselves (``torch.ops.pcops.*`` too). On
    CUDA such a check reads the tensor back to the host, a synchronisation per call, so by
    default it is skipped: the kernels still never read or write out of bounds
    (lengths are clamped to ``[0, N]``, ``start`` is taken modulo the cloud's length, gather
    indices outside ``[0, N)`` read as -1), and an eager training step runs without host
    syncs. With ``set_debug_checks(True)`` the CUDA calls check values too and raise the same
    ``ValueError`` as the CPU (except while a CUDA graph is being captured). The setting is
    process-wide.

    Args:
        enabled: ``True`` to check index values on CUDA too (one host synchronisation per
            checked tensor), ``False`` for the default.

    Returns:
        The previous setting, so that a caller can restore it.

    Example:
        >>> previous = pcops.set_debug_checks(True)   # while hunting a bad index
        >>> ...
        >>> pcops.set_debug_checks(previous)
    """
    return bool(torch.ops.pcops._set_debug_checks(bool(enabled)))
