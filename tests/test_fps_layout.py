"""pcops::_fps_layout (internal, behind pcops.compat.torch_cluster.fps with a batch vector):
against a plain-PyTorch reference on random sorted batch vectors, the per-dtype rounding of
ceil(n * ratio), bad vectors, input checks, opcheck, and CPU against CUDA."""
import pytest
import torch

import pcops  # noqa: F401  (registers the op and its fake)
from helpers import assert_equal

op = torch.ops.pcops._fps_layout.default
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def samples_reference(n, ratio, dtype):
    """ceil(n * ratio) as torch_cluster computes it: in `dtype`, at most n."""
    if n == 0:
        return 0
    k = torch.ceil(torch.tensor(float(n), dtype=dtype) * torch.tensor(ratio, dtype=dtype))
    return min(n, int(k))


def layout_reference(batch, ratio, dtype, batch_size=-1):
    """The definition with plain PyTorch: (stats list, left, slot) of a sorted batch."""
    batch = batch.cpu()
    N = batch.numel()
    left = torch.searchsorted(batch, batch)
    counts = torch.searchsorted(batch, batch, right=True) - left
    rank = torch.arange(N) - left
    L = int(counts.max())
    K = samples_reference(L, ratio, dtype)
    k = torch.tensor([samples_reference(int(n), ratio, dtype) for n in counts.tolist()],
                     dtype=torch.long)
    if batch_size >= 0:
        k = torch.where(batch < batch_size, k, 0)
    keep = rank < k
    slot = torch.where(keep, batch * K + rank, -1)
    stats = [0, int(batch[0]), int(batch[-1]), L, int(keep.sum()), K]
    return stats, left, slot


def random_sorted_batch(gen, clouds, max_size, empty=0.3):
    sizes = torch.randint(1, max_size + 1, (clouds,), generator=gen)
    sizes = torch.where(torch.rand(clouds, generator=gen) < empty, 0, sizes)
    if int(sizes.sum()) == 0:
        sizes[-1] = 1
    return torch.repeat_interleave(torch.arange(clouds), sizes)


def check(batch, ratio, dtype, batch_size=-1, device="cpu"):
    stats, left, slot = op(batch.to(device), ratio, dtype, batch_size)
    for t in (stats, left, slot):
        assert t.dtype == torch.long and t.device.type == device
    exp_stats, exp_left, exp_slot = layout_reference(batch, ratio, dtype, batch_size)
    assert stats.tolist() == exp_stats, (ratio, dtype, batch_size)
    assert_equal(left.cpu(), exp_left, what="left")
    assert_equal(slot.cpu(), exp_slot, what="slot")


@pytest.mark.parametrize("clouds,max_size", [(1, 50), (5, 40), (64, 20), (300, 7), (3, 3000)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_the_reference(device, gen, clouds, max_size, dtype):
    for _ in range(3):
        batch = random_sorted_batch(gen, clouds, max_size)
        for ratio in (0.5, 0.3, 1 / 3, 1.0, 0.01, 0.9999):
            check(batch, ratio, dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_point_and_batch_size(device, dtype):
    check(torch.tensor([0]), 0.5, dtype, device=device)
    check(torch.tensor([4]), 0.1, dtype, device=device)  # starts at cloud 4: 0..3 empty
    batch = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3, 7])
    for bs in (-1, 0, 1, 3, 4, 8, 100):
        check(batch, 0.5, dtype, bs, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_of_every_size(device, dtype):
    """k_b for each n in 1..3000 (half types round n past 2048), one cloud per size."""
    sizes = torch.arange(1, 3001)
    batch = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    for ratio in (0.3, 0.1, 1 / 3, 0.7, 0.9999, 1e-5):
        stats, left, slot = op(batch.to(device), ratio, dtype)
        got = torch.bincount(batch[(slot >= 0).cpu()], minlength=sizes.numel()).tolist()
        exp = [samples_reference(n, ratio, dtype) for n in sizes.tolist()]
        assert got == exp, (ratio, dtype)
        assert stats.tolist()[4] == sum(exp) and stats.tolist()[5] == exp[-1]


def test_products_that_round_up(device):
    """The product rounded in the dtype: in float32 50 * 0.3 is 15.000001 (16 samples, 15 in
    float64), in float64 100 * 0.07 is 7.000000000000001 (8 samples, 7 in float32); float16
    rounds 2051 to 2052 (still at most n) and 1e-9 to 0 (no sample)."""
    cases = [(50, 0.3, torch.float32, 16), (50, 0.3, torch.float64, 15),
             (100, 0.3, torch.float32, 31), (100, 0.3, torch.float64, 30),
             (100, 0.07, torch.float32, 7), (100, 0.07, torch.float64, 8),
             (30, 0.3, torch.float32, 9), (2051, 1.0, torch.float16, 2051),
             (3000, 0.9999, torch.bfloat16, 3000), (1, 1e-9, torch.float16, 0),
             (1, 1e-9, torch.float32, 1), (1, 1e-9, torch.bfloat16, 1)]
    for n, ratio, dtype, k in cases:
        assert samples_reference(n, ratio, dtype) == k, (n, ratio, dtype)
        stats, _, _ = op(torch.zeros(n, dtype=torch.long, device=device), ratio, dtype)
        assert stats.tolist()[4:] == [k, k], (n, ratio, dtype)


def test_bad_vectors_are_counted(device):
    cases = [([0, 1, 0], 1), ([2, 1, 0], 2), ([-1, 0, 0], 1), ([-2, -3], 2), ([0, 0, 1], 0),
             ([-5], 1), ([3, 3, 1, 4, 2], 2)]
    for ids, problems in cases:
        stats, _, _ = op(torch.tensor(ids, device=device), 0.5, torch.float32)
        got = stats.tolist()
        assert got[0] == problems and got[1:3] == [ids[0], ids[-1]], (ids, got)


def test_empty(device):
    stats, left, slot = op(torch.empty(0, dtype=torch.long, device=device), 0.5, torch.float32)
    assert stats.tolist() == [0] * 6 and left.shape == (0,) and slot.shape == (0,)


def test_input_checks(device):
    batch = torch.zeros(4, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="_fps_layout.*'ratio'"):
        op(batch, 0.0, torch.float32)
    with pytest.raises(ValueError, match="_fps_layout.*'ratio'"):
        op(batch, 1.5, torch.float32)
    with pytest.raises(ValueError, match="_fps_layout.*'batch_size'"):
        op(batch, 0.5, torch.float32, -2)
    with pytest.raises(ValueError, match="_fps_layout.*'dtype'"):
        op(batch, 0.5, torch.int64)
    with pytest.raises((ValueError, TypeError), match="_fps_layout.*'batch'"):
        op(batch.int(), 0.5, torch.float32)
    with pytest.raises((ValueError, TypeError), match="_fps_layout.*'batch'"):
        op(batch.view(2, 2), 0.5, torch.float32)


def test_opcheck(device, gen):
    batch = random_sorted_batch(gen, 6, 10).to(device)
    torch.library.opcheck(op, (batch, 0.3, torch.float32, -1))
    torch.library.opcheck(op, (batch, 0.5, torch.float16, 3))


def test_cpu_matches_cuda(cuda, gen):
    for clouds, max_size in [(1, 100), (16, 4096), (500, 9), (3, 70000)]:
        batch = random_sorted_batch(gen, clouds, max_size)
        for dtype in DTYPES:
            for ratio, bs in ((0.3, -1), (0.5, 7), (1 / 3, -1)):
                a = op(batch, ratio, dtype, bs)
                b = op(batch.to(cuda), ratio, dtype, bs)
                for x, y in zip(a, b):
                    assert_equal(y.cpu(), x, what=f"{dtype} {ratio} {bs}")
