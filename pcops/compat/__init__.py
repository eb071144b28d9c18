"""Drop-in APIs of other point-cloud libraries, on top of the pcops ops.

    pcops.compat.pointnet2_ops   ``pointnet2_utils`` of Pointnet2_PyTorch (erikwijmans)
    pcops.compat.pointnet2_modules  its ``pointnet2_modules`` (SA, SA-MSG and FP modules)
    pcops.compat.pytorch3d       ``pytorch3d.ops``: sample_farthest_points, knn_points,
                                 knn_gather, ball_query
    pcops.compat.torch_cluster   ``torch_cluster``: fps, knn, knn_graph, radius, radius_graph

Each module keeps its library's names, argument order, defaults, dtypes and padding
conventions, so code written against the library switches with one line::

    import pcops.compat; pcops.compat.install("pointnet2_ops")
    from pointnet2_ops import pointnet2_utils        # now served by pcops

or without touching ``sys.modules``::

    from pcops.compat import pointnet2_ops as pointnet2_utils

Where the libraries are wrong or skip work, pcops is exact; the differences are listed in the
README ("Coming from pointnet2_ops / PyTorch3D / torch_cluster").
"""
import sys
import types

from . import pointnet2_modules, pointnet2_ops, pytorch3d, torch_cluster

__all__ = ["install", "uninstall", "pointnet2_modules", "pointnet2_ops", "pytorch3d",
           "torch_cluster"]

_INSTALLED = {}  # module name -> what sys.modules held before (None: nothing)


def _package(name: str, doc: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__path__ = []  # a package, so that `import name.sub` looks up sys.modules
    mod.__pcops_compat__ = True
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def _modules(library: str):
    """The sys.modules entries that make `library` importable from pcops."""
    if library == "pointnet2_ops":
        pkg = _package(
            "pointnet2_ops",
            "pointnet2_ops served by pcops.compat.pointnet2_ops",
            pointnet2_utils=pointnet2_ops,
            pointnet2_modules=pointnet2_modules,
        )
        return {"pointnet2_ops": pkg, "pointnet2_ops.pointnet2_utils": pointnet2_ops,
                "pointnet2_ops.pointnet2_modules": pointnet2_modules}
    if library == "pytorch3d":
        ops = pytorch3d
        pkg = _package("pytorch3d", "pytorch3d served by pcops.compat.pytorch3d", ops=ops)
        # `from pytorch3d.ops.knn import knn_points` etc.: the submodules are the same module.
        return {
            "pytorch3d": pkg,
            "pytorch3d.ops": ops,
            "pytorch3d.ops.knn": ops,
            "pytorch3d.ops.ball_query": ops,
            "pytorch3d.ops.sample_farthest_points": ops,
            "pytorch3d.ops.utils": ops,
        }
    if library == "torch_cluster":
        return {"torch_cluster": torch_cluster}
    raise ValueError(
        "pcops.compat.install: argument 'library' must be one of 'pointnet2_ops', 'pytorch3d', "
        f"'torch_cluster', got {library!r}"
    )


def install(library: str, replace: bool = False) -> types.ModuleType:
    """Makes ``import <library>`` (and its submodules used by client code) return pcops's
    implementation, for the rest of the process.

    Args:
        library: ``"pointnet2_ops"``, ``"pytorch3d"`` or ``"torch_cluster"``.
        replace: if the real library is already imported, shadow it anyway (objects already
            taken from it keep pointing at it). Without it, that case raises RuntimeError.

    Returns:
        The module now registered under ``library``.

    Example:
        >>> import pcops.compat
        >>> pcops.compat.install("pointnet2_ops")
        >>> from pointnet2_ops import pointnet2_utils
        >>> idx = pointnet2_utils.furthest_point_sample(xyz, 512)   # int32, as there
    """
    entries = _modules(library)
    current = sys.modules.get(library)
    if current is not None and not getattr(current, "__pcops_compat__", False) and not replace:
        raise RuntimeError(
            f"pcops.compat.install: {library!r} is already imported from "
            f"{getattr(current, '__file__', '?')}; pass replace=True to shadow it"
        )
    for name, mod in entries.items():
        if name not in _INSTALLED:
            _INSTALLED[name] = sys.modules.get(name)
        sys.modules[name] = mod
    return entries[library]


def uninstall(library: str) -> None:
    """Undoes :func:`install`: restores what ``sys.modules`` held before (or nothing)."""
    for name in _modules(library):
        if name in _INSTALLED:
            previous = _INSTALLED.pop(name)
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
