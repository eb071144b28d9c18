"""The sizes a forced CUDA FPS path takes on a device, as its plan function decides them
(kernels/fps/*.cuh: plan_group, plan_pruned, plan_bucket, plan_bucket_groups,
plan_bucket_rounds). The shared-memory paths depend on the device's opt-in limit
(cudaDevAttrMaxSharedMemoryPerBlockOptin); tests/test_fps_plan_smem.py checks this model against
the plans themselves on simulated devices (lab/fps_plan_dump.cpp), the CUDA tests of
tests/test_fps.py use it to expect a run or a refusal on the GPU at hand."""

KIB = 1024
H100_OPTIN = 227 * KIB  # sm_90, sm_100

# register paths: the most points of a cloud, float32 / float64 (device-independent)
_REGISTER_CAPACITY = {"warp": (1024, 512), "block": (8192, 4096)}

# the grouped bucket paths: static shared memory of the kernel and dynamic bytes a bucket
# (kGroupsStaticSmem / kGroupsSmemPerBucket, kRoundsStaticSmem / kRoundsSmemPerBucket)
_GROUPED = {"bucket_groups": (KIB, 24),
            "bucket_rounds": (5 * KIB, 28),
            "bucket_rounds_cluster": (5 * KIB, 28)}


def _ceil(a, b):
    return -(-a // b)


def pruned_smem(itemsize, N):
    """BLOCK_PRUNED's shared memory (static and dynamic) for a cloud of N points, or None when
    its shape does not exist (plan_pruned, pruned_smem_bytes)."""
    n = max(N, 1)
    ppt = 8
    if n > 16 * 32 * 8:
        if itemsize != 4:
            return None
        ppt = 16
    warps = max(2, _ceil(n, 32 * ppt))
    if warps > (24 if itemsize == 4 else 16):
        return None
    smem_points = warps > 16
    scratch = (16 ** 3 + 1) * 4 + n * 6
    points = warps * 32 * ppt * 16 if smem_points else 0
    head = 2 * warps * 2 * itemsize + max(scratch, points)  # Candidate<T>: value, index
    dynamic = head if smem_points else _ceil(head, 16) * 16 + n * 4 * itemsize
    return dynamic + 6 * 32 * itemsize


def grouped_max_buckets(variant, optin):
    static, per = _GROUPED[variant]
    return min(4096, max(0, (optin - static) // per))


def grouped_capacity(variant, optin):
    """The most points of a cloud a grouped bucket path takes: buckets of up to 256 points, 8
    blocks a cloud for bucket_rounds_cluster."""
    blocks = 8 if variant == "bucket_rounds_cluster" else 1
    return blocks * grouped_max_buckets(variant, optin) * 256


def path_takes(variant, itemsize, N, optin=H100_OPTIN):
    """True when the forced path takes one cloud of N points on a device of `optin` bytes of
    shared memory a block, False when it refuses them, None when it does not run for the dtype.
    simple, cluster, grid and bucket take any size the CUDA plan takes (N <= 2**31 - 1; bucket:
    B * N too)."""
    if N > 2**31 - 1:
        return False
    if variant in _REGISTER_CAPACITY:
        return N <= _REGISTER_CAPACITY[variant][itemsize == 8]
    if variant == "block_pruned":
        smem = pruned_smem(itemsize, N)
        return smem is not None and smem <= optin
    if variant in _GROUPED:
        if itemsize != 4:
            return None
        return N <= grouped_capacity(variant, optin)
    return True
