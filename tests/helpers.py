"""Input builders and comparisons shared by the op tests (and reused by the benchmarks)."""
import numpy as np
import torch

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def rand_points(B, N, gen, *, dtype=torch.float32, device="cpu", scale=1.0, offset=0.0):
    """B clouds of N uniform points in [offset, offset + scale)^3, drawn on the CPU from `gen`."""
    x = torch.rand(B, N, 3, generator=gen, dtype=torch.float64) * scale + offset
    return x.to(dtype).to(device)


def clustered_points(B, N, gen, *, dtype=torch.float32, device="cpu", clusters=8):
    """Points snapped to a coarse grid of values, so that many exact distance ties occur."""
    x = torch.randint(0, clusters, (B, N, 3), generator=gen).to(torch.float64) / clusters
    return x.to(dtype).to(device)


def random_lengths(B, N, gen, *, device="cpu", allow_zero=True):
    lo = 0 if allow_zero else min(1, N)
    return torch.randint(lo, N + 1, (B,), generator=gen).to(device)


def assert_close(actual, expected, *, atol=0.0, rtol=0.0, what="values"):
    """|actual - expected| <= atol + rtol * |expected| everywhere (inf == inf), reporting the
    worst element, its index and both values on failure."""
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
    same = (a == e) | (torch.isnan(a) & torch.isnan(e))
    err = torch.where(same, torch.zeros_like(a), (a - e).abs())
    tol = atol + rtol * e.abs()
    bad = ~(same | (err <= tol))
    if bad.any():
        excess = torch.where(bad, err - tol, torch.full_like(err, -1.0)).nan_to_num(nan=float("inf"))
        i = int(excess.flatten().argmax())
        where = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.numel()} elements differ beyond atol={atol}, rtol={rtol}; "
            f"worst at {where}: got {a.flatten()[i].item()!r}, expected {e.flatten()[i].item()!r}"
        )


def assert_equal(actual, expected, *, what="values"):
    assert_close(actual, expected, what=what)


def features(B, N, D, gen, dtype=torch.float32, device="cpu"):
    """B clouds of N points with D standard normal coordinates, drawn on the CPU from `gen`."""
    return torch.randn(B, N, D, generator=gen, dtype=torch.float64).to(dtype).to(device)


def assert_bits(actual, expected, what):
    """Equal values (a readable message first), then equal bit patterns (+0 / -0 too)."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    assert_equal(actual, expected, what=what)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.is_floating_point():
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
        assert torch.equal(actual.view(ints), expected.view(ints)), f"{what}: bit patterns differ"


def dist2_saturated(a, b):
    """The contract's squared distance of every pair of rows of a [M, 3] and b [N, 3], in NumPy
    in their own precision ((dx*dx + dy*dy) + dz*dz, each operation rounded once), with the
    overflow rule of kernels/geometry.h: where the sum overflows between two points whose
    coordinates are all finite, the dtype's largest finite value instead of +inf (+inf means an
    empty slot); an infinite coordinate keeps +inf or NaN. Returns [M, N]."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a[:, None, :] - b[None, :, :]
        d = (diff[..., 0] * diff[..., 0] + diff[..., 1] * diff[..., 1]) + diff[..., 2] * diff[..., 2]
    finite = np.isfinite(a).all(1)[:, None] & np.isfinite(b).all(1)[None, :]
    return np.where((d == np.inf) & finite, np.finfo(d.dtype).max, d)


def to_dist_dtype(d, dtype):
    """A distance tensor (float32 / float64) as the ops return it in `dtype`: for float16 and
    bfloat16, finite values above the type's largest finite value become that value (they
    would round to +inf, which means an empty slot)."""
    if dtype in (torch.float16, torch.bfloat16):
        top = torch.finfo(dtype).max
        d = torch.where((d > top) & (d < float("inf")), torch.full_like(d, top), d)
    return d.to(dtype)
