"""Input checks that cost no device read: size errors naming the op (fuzz-style, CPU), the
debug mode of value checks on CUDA, and an eager PointNet++ set-abstraction step on CUDA
without a single host synchronisation."""
import math

import pytest
import torch

import pcops

MEMORY_HOG = 2**62  # an element count no machine can allocate


def huge(gen, low=40, high=62):
    """A random size between 2**low and 2**high."""
    return int(2 ** (low + (high - low) * torch.rand(1, generator=gen).item()))


# ---------------------------------------------------------------------------------------------
# outputs that cannot be allocated: a ValueError naming the op and the argument, before any
# allocation or value check (expanded inputs below cost no memory, and must not be read)


def test_group_output_too_large_names_idx(gen):
    for _ in range(5):
        M, S = huge(gen, 20, 31), huge(gen, 20, 31)
        features = torch.zeros(1, 1, 1).expand(2, 7, 4096)
        idx = torch.zeros(1, 1, 1, dtype=torch.long).expand(2, M, S)
        with pytest.raises(ValueError, match=r"pcops\.group: argument 'idx' asks for an output of shape "
                           rf"\[2, {M}, {S}, 4096\] .* more than the memory of cpu"):
            pcops.group(features, idx)


def test_group_backward_output_too_large_names_num_points(gen):
    grad_out = torch.zeros(2, 3, 4, 8)
    idx = torch.zeros(2, 3, 4, dtype=torch.long)
    for _ in range(5):
        n = huge(gen)
        with pytest.raises(ValueError, match=rf"pcops\.group_backward: argument 'num_points' asks for an output of shape \[2, {n}, 8\]"):
            pcops.group_backward(grad_out, idx, n)
    # the largest num_points whose output fits is not refused by the size check (the values
    # of idx are, on the CPU, checked after it)
    with pytest.raises(ValueError, match=r"'idx' must hold values in \[-1, num_points\)"):
        pcops.group_backward(grad_out, idx - 2, 10)


@pytest.mark.parametrize("op,arg", [("knn", "k"), ("ball_query", "nsample"), ("furthest_point_sample", "npoint")])
def test_search_output_too_large(gen, op, arg):
    x = torch.rand(2, 5, 3)
    calls = {
        "knn": lambda n: pcops.knn(x, x, n),
        "ball_query": lambda n: pcops.ball_query(x, x, 0.1, n),
        "furthest_point_sample": lambda n: pcops.furthest_point_sample(x, n),
    }
    for _ in range(3):
        n = huge(gen)
        shape = rf"\[2, {n}\]" if op == "furthest_point_sample" else rf"\[2, 5, {n}\]"
        with pytest.raises(ValueError, match=rf"pcops\.{op}: argument '{arg}' asks for an output of shape {shape}"):
            calls[op](n)


# More than 2**31 - 1 points in one cloud: an expanded [1, 2**31 + d, 3] tensor costs no
# memory: the bindings check the size before any contiguous copy (which would be 24 GiB).


@pytest.mark.parametrize("op", ["knn", "ball_query"])
def test_query_ref_cloud_too_large(gen, op):
    n = 2**31 + int(torch.randint(0, 1000, (1,), generator=gen))
    big = torch.zeros(1, 1, 3).expand(1, n, 3)
    small = torch.rand(1, 4, 3)
    call = (lambda q, r: pcops.knn(q, r, 2)) if op == "knn" else (lambda q, r: pcops.ball_query(q, r, 0.1, 2))
    with pytest.raises(ValueError, match=rf"pcops\.{op}: argument 'ref' has N = {n} points per cloud; at most 2\*\*31 - 1"):
        call(small, big)
    with pytest.raises(ValueError, match=rf"pcops\.{op}: argument 'query' has M = {n} points per cloud"):
        call(big, small)


def test_fps_cloud_too_large(gen):
    n = 2**31 + int(torch.randint(0, 1000, (1,), generator=gen))
    with pytest.raises(ValueError, match=rf"pcops\.furthest_point_sample: argument 'xyz' has N = {n} points per cloud"):
        pcops.furthest_point_sample(torch.zeros(1, 1, 3).expand(1, n, 3), 4)


# ---------------------------------------------------------------------------------------------
# value checks: exact on the CPU always; on CUDA only in debug mode


def test_set_debug_checks_returns_the_previous_setting():
    first = pcops.set_debug_checks(True)
    try:
        assert pcops.set_debug_checks(False) is True
        assert pcops.set_debug_checks(False) is False
    finally:
        pcops.set_debug_checks(first)


def test_cpu_checks_values_without_debug_mode():
    previous = pcops.set_debug_checks(False)
    try:
        with pytest.raises(ValueError, match=r"pcops\.group: argument 'idx' must hold values in \[-1, N\) = \[-1, 4\), got values in \[-3, 9\]"):
            pcops.group(torch.rand(1, 4, 2), torch.tensor([[[9, -3]]]))
    finally:
        pcops.set_debug_checks(previous)


def test_cuda_values_unchecked_by_default_and_checked_in_debug_mode(cuda):
    features = torch.rand(1, 4, 2, device="cuda")
    idx = torch.tensor([[[9, -3, 1]]], device="cuda")
    previous = pcops.set_debug_checks(False)
    try:
        out = pcops.group(features, idx)  # outside [0, N) reads as -1: zeros
        torch.testing.assert_close(out[0, 0, :2], torch.zeros(2, 2, device="cuda"))
        torch.testing.assert_close(out[0, 0, 2], features[0, 1])
        grad = pcops.group_backward(torch.ones(1, 1, 3, 2, device="cuda"), idx, 4)
        torch.testing.assert_close(grad[0, :, 0], torch.tensor([0.0, 1.0, 0.0, 0.0], device="cuda"))
        pcops.set_debug_checks(True)
        with pytest.raises(ValueError, match=r"pcops\.group: argument 'idx' must hold values in \[-1, N\) = \[-1, 4\), got values in \[-3, 9\]"):
            pcops.group(features, idx)
    finally:
        pcops.set_debug_checks(previous)


# ---------------------------------------------------------------------------------------------
# an eager PointNet++ set-abstraction step on CUDA without host synchronisation
# (passes once every op on the path -- fps, ball_query, group -- has dropped its syncs)


def _ssg_step(xyz, features, mlp, npoint, radius, nsample):
    idx = pcops.furthest_point_sample(xyz.detach(), npoint)             # [B, npoint]
    centres = pcops.group(xyz, idx[:, :, None])[:, :, 0]                 # [B, npoint, 3]
    neighbours = pcops.ball_query(centres.detach(), xyz.detach(), radius, nsample)  # [B, npoint, nsample]
    local = pcops.group(xyz, neighbours) - centres[:, :, None]           # relative coordinates
    grouped = torch.cat([local, pcops.group(features, neighbours)], -1)  # [B, npoint, nsample, 3+C]
    pooled = mlp(grouped).max(dim=2).values                             # [B, npoint, C']
    loss = pooled.square().mean()
    loss.backward()
    return loss.detach()


def test_cuda_ssg_forward_backward_without_host_sync(cuda, seed):
    B, N, C, npoint, nsample = 4, 4096, 16, 512, 32
    xyz = torch.rand(B, N, 3, device="cuda", requires_grad=True)
    features = torch.randn(B, N, C, device="cuda", requires_grad=True)
    mlp = torch.nn.Sequential(torch.nn.Linear(3 + C, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128)).cuda()
    _ssg_step(xyz, features, mlp, npoint, 0.1, nsample)  # warm-up: lazy init, allocator, cub sizing
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = _ssg_step(xyz, features, mlp, npoint, 0.1, nsample)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert math.isfinite(loss.item())
    assert features.grad is not None and xyz.grad is not None
