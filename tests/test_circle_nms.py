"""circle_nms and circle_nms_mask: against a plain greedy NumPy loop, greedy properties in
float64, ties, groups, dtypes, CUDA graphs / streams / compile, bad inputs."""
import math

import numpy as np
import pytest
import torch

import pcops
from pcops._paths import PATHS
from conftest import HAS_CUDA
from helpers import FLOAT_DTYPES, assert_equal

nms_op = torch.ops.pcops.circle_nms.default
mask_op = torch.ops.pcops.circle_nms_mask.default
variant_op = torch.ops.pcops._circle_nms_path.default
PATH = {name: i for name, (i, _, _) in PATHS["circle_nms"].items()}  # name -> id
BLOCK_MAX = 4096  # PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX: the single-block CUDA path up to here
FLOW_MAX = 4096  # PCOPS_CIRCLE_NMS_CUDA_FLOW_MAX: the dataflow CUDA path up to here


# ---------------------------------------------------------------------------------------------
# inputs


def detections(N, gen, *, density=4.0, dtype=torch.float32, n_groups=0, offset=0.0, grid=None):
    """N detections: centres [N, 3] uniform over a square holding `density` boxes per unit area
    (so radius 0.5 gives about 3 neighbours whatever N), scores [N] uniform in [0, 1), and
    groups [N] in [0, n_groups) (None when n_groups is 0). With `grid`, centres are snapped
    to multiples of 1/grid, so that many distances tie exactly and every coordinate, also
    around `offset` = 1e5, is exact in float32."""
    side = math.sqrt(max(N, 1) / density)
    xyz = torch.rand(N, 3, generator=gen, dtype=torch.float64) * side
    if grid:
        xyz = torch.round(xyz * grid) / grid
    centers = (xyz + offset).to(dtype)
    scores = torch.rand(N, generator=gen, dtype=torch.float64).float()
    groups = torch.randint(0, n_groups, (N,), generator=gen) if n_groups else None
    return centers, scores, groups


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


# ---------------------------------------------------------------------------------------------
# references


def visiting_order(scores):
    """Indices by descending score, equal scores lower index first, NaN scores first (ranked
    above every number, as torch.sort ranks them)."""
    s = np.asarray(scores, dtype=np.float64)
    return sorted(range(len(s)), key=lambda i: (0, 0.0, i) if np.isnan(s[i]) else (1, -s[i], i))


def circle_nms_reference(centers, scores, radius, groups=None, dtype=np.float64):
    """Greedy circle NMS written for clarity. Distances in `dtype` with the op's formula
    (dx*dx + dy*dy, separate NumPy multiplies and adds, so no FMA) against radius**2 rounded
    to `dtype`: with dtype=np.float32 this reproduces the op's float32 arithmetic exactly."""
    xy = np.asarray(centers, dtype=np.float64)[:, :2].astype(dtype)
    r2 = dtype(radius * radius)
    N = len(xy)
    g = np.zeros(N, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    kept = []
    kx, ky, kg = np.empty(N, dtype), np.empty(N, dtype), np.empty(N, np.int64)  # the kept boxes
    for i in visiting_order(scores):
        n = len(kept)
        dx = kx[:n] - xy[i, 0]
        dy = ky[:n] - xy[i, 1]
        d = dx * dx + dy * dy
        if not np.any((kg[:n] == g[i]) & (d < r2)):
            kept.append(i)
            kx[n], ky[n], kg[n] = xy[i, 0], xy[i, 1], g[i]
    return kept


def reference_for(centers, scores, radius, groups=None):
    """The reference in the op's compute precision: float64 for float64 centres, float32 for
    the others (half types upcast exactly)."""
    dtype = np.float64 if centers.dtype == torch.float64 else np.float32
    return circle_nms_reference(
        centers.cpu().double(), scores.cpu().double(), radius,
        None if groups is None else groups.cpu(), dtype,
    )


def greedy_violations(centers, scores, radius, keep, groups=None, rtol=1e-5):
    """Checks in float64, independently of the float32 details, that `keep` is the greedy NMS
    result: in visiting order; no two kept boxes of a group closer than the radius; every other
    box within the radius of an earlier kept box of its group. rtol leaves room for float32
    rounding of near-threshold distances. Returns a list of problems (empty when fine)."""
    xy = np.asarray(centers.cpu(), dtype=np.float64)[:, :2]
    N = len(xy)
    g = np.zeros(N, np.int64) if groups is None else np.asarray(groups.cpu())
    order = visiting_order(scores.cpu())
    pos = np.empty(N, np.int64)
    pos[order] = np.arange(N)
    keep = np.asarray(keep.cpu(), dtype=np.int64)
    problems = []
    if len(keep) and not (np.diff(pos[keep]) > 0).all():
        problems.append("kept indices not in visiting order")
    if len(np.unique(keep)) != len(keep):
        problems.append("duplicate kept indices")
    r2 = radius * radius
    is_kept = np.zeros(N, bool)
    is_kept[keep] = True
    for start in range(0, N, 2048):  # [rows, kept] blocks keep the memory small
        rows = np.arange(start, min(start + 2048, N))
        d = ((xy[rows, None, :] - xy[None, keep, :]) ** 2).sum(-1)
        same = g[rows, None] == g[None, keep]
        earlier = pos[keep][None, :] < pos[rows][:, None]
        close = same & earlier & (d < r2 * (1 + rtol))
        for r in np.flatnonzero(is_kept[rows]):
            if (same[r] & earlier[r] & (d[r] < r2 * (1 - rtol))).any():
                problems.append(f"kept box {rows[r]} lies within the radius of an earlier kept box")
        for r in np.flatnonzero(~is_kept[rows] & ~close.any(1)):
            problems.append(f"box {rows[r]} removed, but no earlier kept box lies within the radius")
    return problems


def check_result(centers, scores, radius, groups, device, expected=None):
    """Runs both ops on `device` and checks them against the reference (exact) and each other."""
    c, s, g = to(device, centers, scores, groups)
    keep = nms_op(c, s, radius, -1, g)
    mask = mask_op(c, s, radius, g)
    assert keep.dtype == torch.int64 and keep.device.type == device and keep.dim() == 1
    assert mask.dtype == torch.bool and mask.shape == (len(centers),)
    if expected is None:
        expected = reference_for(centers, scores, radius, groups)
    assert keep.cpu().tolist() == expected, f"kept {keep.cpu().tolist()[:20]}... != reference {expected[:20]}..."
    expected_mask = torch.zeros(len(centers), dtype=torch.bool)
    expected_mask[expected] = True
    assert_equal(mask, expected_mask, what="keep_mask")
    return keep


# ---------------------------------------------------------------------------------------------
# results


@pytest.mark.parametrize("N", [0, 1, 2, 3, 5, 7, 8, 63, 64, 65, 127, 128, 129, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_groups", [0, 3])
def test_matches_reference(device, gen, N, dtype, n_groups):
    centers, scores, groups = detections(N, gen, dtype=dtype, n_groups=n_groups)
    keep = check_result(centers, scores, 0.5, groups, device)
    assert not greedy_violations(centers, scores, 0.5, keep, groups)


@pytest.mark.parametrize("N,n_groups", [(5000, 0), (5000, 7), (20000, 2)])
def test_large_matches_reference(device, gen, N, n_groups):
    # past the CPU's one-thread limit (4096) and many 64-box blocks on CUDA
    centers, scores, groups = detections(N, gen, n_groups=n_groups)
    check_result(centers, scores, 0.5, groups, device)


@pytest.mark.parametrize("radius", [0.05, 0.3, 1.0, 3.0, 30.0])
def test_greedy_properties_in_float64(device, gen, radius):
    """Few to all boxes suppressed; checked in float64 with the properties that define greedy
    NMS, independent of the float32 reference."""
    centers, scores, groups = detections(1500, gen, n_groups=2)
    keep = nms_op(*to(device, centers, scores), radius, -1, groups.to(device))
    problems = greedy_violations(centers, scores, radius, keep, groups)
    assert not problems, problems[:5]
    if radius == 30.0:
        assert len(keep) == 2  # the whole scene is one circle: one box per group


@pytest.mark.parametrize("case", ["clustered", "utm", "utm_grid"])
def test_ties_and_large_coordinates(device, gen, case):
    N = 3000
    if case == "clustered":  # few distinct positions: duplicates and exact distance ties
        centers, scores, groups = detections(N, gen, grid=2, n_groups=2)
        scores = torch.round(scores * 8) / 8  # and many equal scores
    elif case == "utm":  # lidar in UTM metres
        centers, scores, groups = detections(N, gen, offset=1e5)
    else:  # exact in float32 at 1e5; radius 0.5 hits distances exactly at the threshold
        centers, scores, groups = detections(N, gen, offset=1e5, grid=16)
    check_result(centers, scores, 0.5, groups, device)


@pytest.mark.parametrize("shape", ["wide", "tall", "negative"])
def test_elongated_and_negative_scenes(device, gen, shape):
    """Scenes spread along x, along y, and around the origin (negative coordinates, -0.0)."""
    centers, scores, groups = detections(3000, gen, grid=4, n_groups=3)
    if shape == "wide":
        centers[:, 0] *= 20
    elif shape == "tall":
        centers[:, 1] *= 20
    else:
        centers = torch.round((centers - centers.mean(0)) * 4) / 4
        assert (centers == 0).any() and (centers < 0).any()
    check_result(centers, scores, 0.5, groups, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [1e-30, 0.5, 1e20, 1e200])
def test_non_finite_and_extreme_values(device, gen, dtype, radius):
    """inf / NaN / huge centres (distances overflow to inf, or are NaN: never within the
    radius), and radii whose square rounds to 0 or overflows to inf in the compute dtype."""
    centers, scores, groups = detections(400, gen, grid=2, n_groups=2)
    big = torch.finfo(dtype).max / 2
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), big, -big])
    pick = torch.randint(0, 5, (80, 2), generator=gen)
    centers = centers.to(dtype)
    centers[:80, :2] = torch.where(torch.rand(80, 2, generator=gen) < 0.5, specials[pick].to(dtype), centers[:80, :2])
    centers[80:90, :2] = big  # a cluster of huge but finite centres
    with np.errstate(all="ignore"):
        check_result(centers, scores, radius, groups, device)


def test_translation_to_1e5_keeps_the_same_boxes(device, gen):
    """On a 1/16 grid the coordinates and their differences are exact in float32 also at
    1e5, so the NMS of the moved scene is the NMS of the original: no precision is lost to
    large coordinates."""
    centers, scores, _ = detections(2000, gen, grid=16)
    near = nms_op(*to(device, centers, scores), 0.5)
    far = nms_op(*to(device, centers + 1e5, scores), 0.5)
    assert_equal(far, near, what="keep")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distance_equal_to_radius_is_kept(device, dtype):
    """The comparison is strict: at exactly the radius both boxes stay; a hair closer, the
    lower-scoring one goes. z never counts."""
    centers = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 50.0], [0.0, 0.75, -9.0]], dtype=dtype)
    scores = torch.tensor([0.9, 0.8, 0.7])
    # (0,0)-(1,0) exactly 1; (0,0)-(0,0.75) 0.75; (1,0)-(0,0.75) 1.25
    assert nms_op(*to(device, centers, scores), 1.0).tolist() == [0, 1]
    assert nms_op(*to(device, centers, scores), 1.0000001).tolist() == [0]
    assert nms_op(*to(device, centers, scores), 0.75).tolist() == [0, 1, 2]
    assert nms_op(*to(device, centers[:, :2], scores), 1.0).tolist() == [0, 1]


def test_equal_scores_visit_the_lower_index_first(device):
    # three identical centres and equal scores: the first one is kept
    centers = torch.zeros(3, 2)
    scores = torch.full((3,), 0.5)
    assert nms_op(*to(device, centers, scores), 0.1).tolist() == [0]
    # a chain 0 - 1 - 2 at distance 1 (radius 1.5): visiting 0 first removes 1, so 2 is kept
    chain = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    assert nms_op(*to(device, chain, scores), 1.5).tolist() == [0, 2]
    # reversed indices: now box 0 is at the end of the chain
    assert nms_op(*to(device, chain.flip(0), scores), 1.5).tolist() == [0, 2]
    # a higher score wins whatever its index
    s = torch.tensor([0.5, 0.9, 0.5])
    assert nms_op(*to(device, chain, s), 1.5).tolist() == [1]
    # all scores equal on a larger scene: the NMS in index order
    centers, _, _ = detections(500, torch.Generator().manual_seed(0))
    flat = torch.full((500,), 1.0)
    check_result(centers, flat, 0.5, None, device)


def test_duplicate_boxes_keep_only_the_best(device, gen):
    base = torch.stack([torch.arange(100) * 2.0, torch.zeros(100)], 1)  # 2 apart: no overlaps
    centers = base.repeat(4, 1)  # every box 4 times
    scores = torch.rand(400, generator=gen)
    keep = nms_op(*to(device, centers, scores), 0.5)
    best = scores.view(4, 100).argmax(0) * 100 + torch.arange(100)
    assert sorted(keep.cpu().tolist()) == sorted(best.tolist())


def test_groups_are_independent(device, gen):
    """With groups, the result is the union of the NMS of each group alone, in visiting order;
    group ids may be any int64 values."""
    centers, scores, _ = detections(1200, gen, density=8.0)
    ids = torch.tensor([-(2**62), -1, 0, 7, 2**62 + 5])
    groups = ids[torch.randint(0, len(ids), (1200,), generator=gen)]
    keep = nms_op(*to(device, centers, scores), 0.5, -1, groups.to(device)).cpu()
    union = []
    for v in ids:
        sel = torch.nonzero(groups == v).flatten()
        union += sel[nms_op(*to(device, centers[sel], scores[sel]), 0.5).cpu()].tolist()
    union.sort(key=lambda i: (-scores[i].item(), i))
    assert keep.tolist() == union
    # one group is the same as no groups
    same = nms_op(*to(device, centers, scores), 0.5, -1, torch.full((1200,), 3, device=device))
    assert_equal(same, nms_op(*to(device, centers, scores), 0.5))


def test_max_out(device, gen):
    centers, scores, groups = detections(800, gen, n_groups=3)
    c, s, g = to(device, centers, scores, groups)
    full = nms_op(c, s, 0.5, -1, g)
    K = len(full)
    assert K > 20
    for max_out in [1, 7, K - 1, K, K + 1, 10**9]:
        assert_equal(nms_op(c, s, 0.5, max_out, g), full[: min(K, max_out)], what=f"max_out={max_out}")
    for max_out in [0, -1, -5]:  # <= 0: no limit
        assert_equal(nms_op(c, s, 0.5, max_out, g), full, what=f"max_out={max_out}")
    assert_equal(pcops.circle_nms(c, s, 0.5, max_out=5, groups=g), full[:5])


def test_nan_scores_are_visited_first(device):
    centers = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [9.0, 9.0]])
    scores = torch.tensor([0.9, float("nan"), float("nan"), 0.8, -float("inf")])
    # NaN boxes 1 then 2 first (index order), removing 0 and 3; box 4 (-inf) is alone
    assert nms_op(*to(device, centers, scores), 0.5).tolist() == [1, 2, 4]
    assert mask_op(*to(device, centers, scores), 0.5).tolist() == [False, True, True, False, True]


def test_nan_centres_are_kept_and_remove_nothing(device):
    nan = float("nan")
    centers = torch.tensor([[nan, 0.0], [0.0, 0.0], [0.1, nan], [0.2, 0.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    assert nms_op(*to(device, centers, scores), 0.5).tolist() == [0, 1, 2]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.float16])
def test_every_dtype(device, gen, dtype, score_dtype):
    centers, scores, groups = detections(700, gen, dtype=dtype, n_groups=2)
    scores = scores.to(score_dtype)  # float16 scores tie often: the ties go to the lower index
    check_result(centers, scores, 0.5, groups, device)


def test_non_contiguous_inputs(device, gen):
    centers, scores, groups = detections(600, gen, n_groups=3)
    boxes = torch.cat([centers, torch.rand(600, 4, generator=gen)], 1).to(device)  # [N, 7]
    c = boxes[:, :2]  # the usual call: a strided view
    s = torch.stack([scores, scores], 1).to(device)[:, 1]
    g = torch.stack([groups, groups], 1).to(device)[:, 0]
    assert not (c.is_contiguous() or s.is_contiguous() or g.is_contiguous())
    assert_equal(nms_op(c, s, 0.5, -1, g), nms_op(c.contiguous(), s.contiguous(), 0.5, -1, g.contiguous()))
    assert_equal(mask_op(c, s, 0.5, g), mask_op(c.contiguous(), s.contiguous(), 0.5, g.contiguous()))
    check_result(boxes[:, :3].cpu(), scores, 0.5, groups, device)


def test_empty(device):
    for D in (2, 3):
        c = torch.empty(0, D, device=device)
        s = torch.empty(0, device=device)
        g = torch.empty(0, dtype=torch.long, device=device)
        keep = nms_op(c, s, 1.0, -1, g)
        assert keep.shape == (0,) and keep.dtype == torch.int64
        mask = mask_op(c, s, 1.0)
        assert mask.shape == (0,) and mask.dtype == torch.bool


def test_mask_is_the_kept_set(device, gen):
    centers, scores, groups = detections(2000, gen, n_groups=4)
    c, s, g = to(device, centers, scores, groups)
    keep = nms_op(c, s, 0.7, -1, g)
    mask = mask_op(c, s, 0.7, g)
    assert_equal(torch.nonzero(mask).flatten(), keep.sort().values)
    # the mask ordered by descending score gives circle_nms
    order = torch.sort(s, stable=True, descending=True).indices
    assert_equal(order[mask[order]], keep)


def test_wrappers(gen):
    centers, scores, groups = detections(300, gen, n_groups=2)
    assert_equal(pcops.circle_nms(centers, scores, 0.5, groups=groups), nms_op(centers, scores, 0.5, -1, groups))
    assert_equal(pcops.circle_nms_mask(centers, scores, 0.5, groups), mask_op(centers, scores, 0.5, groups))
    assert pcops.circle_nms.__doc__ and "math.sqrt(thresh)" in pcops.circle_nms.__doc__


def test_centerpoint_mapping(gen):
    """The docstring's mapping from CenterPoint's numba circle_nms(dets, thresh): squared
    distance <= thresh there; radius = sqrt(thresh) here. Equal away from exact ties: equal
    scores are taken lower index first (pcops's order; numba's argsort leaves it open), and a
    sample with a pair within 1e-6 of the threshold is drawn again."""
    thresh = 0.3
    for _ in range(20):
        centers, scores, _ = detections(1000, gen)
        xy64 = centers[:, :2].double()
        if not bool(((torch.cdist(xy64, xy64) ** 2 - thresh).abs() < 1e-6).any()):
            break
    else:
        raise AssertionError("no sample without a pair at the threshold drawn")
    s = scores.numpy()
    order = np.lexsort((np.arange(len(s)), -s))  # highest score first, ties to the lower index
    xy = centers[:, :2].numpy()
    suppressed = np.zeros(1000, bool)
    theirs = []
    for a, i in enumerate(order):
        if suppressed[i]:
            continue
        theirs.append(int(i))
        j = order[a + 1:]
        suppressed[j] |= ((xy[j] - xy[i]) ** 2).sum(1) <= thresh
    assert nms_op(centers, scores, math.sqrt(thresh)).tolist() == theirs


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, gen, requires_grad):
    centers, scores, groups = detections(150, gen, n_groups=2)
    c, s, g = to(device, centers, scores, groups)
    c.requires_grad_(requires_grad)
    s.requires_grad_(requires_grad)
    torch.library.opcheck(mask_op, (c, s, 0.5))
    torch.library.opcheck(mask_op, (c, s, 0.5, g))
    torch.library.opcheck(nms_op, (c, s, 0.5))
    torch.library.opcheck(nms_op, (c, s, 0.5, 10, g))


def test_inputs_that_require_grad(device, gen):
    """The Autograd key falls through to the kernels (bindings/circle_nms.cpp): inputs that
    require grad are accepted and the outputs (indices, masks) carry no graph."""
    centers, scores, groups = detections(300, gen, n_groups=2)
    c, s, g = to(device, centers, scores, groups)
    c.requires_grad_(True)
    s.requires_grad_(True)
    for out in (nms_op(c, s, 0.5, -1, g), mask_op(c, s, 0.5, g), *variant_op(c, s, 0.5, g, 0)):
        assert not out.requires_grad and out.grad_fn is None
    assert_equal(nms_op(c, s, 0.5, -1, g), nms_op(c.detach(), s.detach(), 0.5, -1, g))


def test_compile(device, gen):
    """circle_nms_mask compiles into one graph; circle_nms compiles with its data-dependent
    output size captured, or with a graph break."""
    centers, scores, groups = detections(400, gen, n_groups=2)
    c, s, g = to(device, centers, scores, groups)
    backend = "inductor" if device == "cuda" else "aot_eager"  # keeps the CPU suite quick
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend=backend)
    def kept_score_sum(c, s, g):
        keep = pcops.circle_nms_mask(c, s, 0.5, g)
        return torch.where(keep, s, 0.0).sum(), keep

    total, keep = kept_score_sum(c, s, g)
    assert_equal(keep, mask_op(c, s, 0.5, g))
    assert torch.allclose(total, s[keep].sum())

    def top_boxes(c, s, g):
        keep = pcops.circle_nms(c, s, 0.5, 50, g)
        return c[keep] * 2

    expected = top_boxes(c, s, g)
    assert_equal(torch.compile(top_boxes, backend=backend)(c, s, g), expected)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        assert_equal(torch.compile(top_boxes, fullgraph=True, backend=backend)(c, s, g), expected)


# ---------------------------------------------------------------------------------------------
# CUDA only


@pytest.mark.parametrize("N", [1, 2, 63, 64, 65, 127, 128, 129, 1000, 4096, 5000, 20000, 50000])
def test_cuda_matches_cpu(cuda, gen, N):
    centers, scores, groups = detections(N, gen, n_groups=3)
    for dtype in [torch.float32, torch.float64]:
        for g in [None, groups]:
            c = centers.to(dtype)
            expected = nms_op(c, scores, 0.5, -1, g)
            got = nms_op(*to(cuda, c, scores, g)[:2], 0.5, -1, None if g is None else g.cuda())
            assert_equal(got, expected, what=f"keep, {dtype}, groups={g is not None}")
            mask = mask_op(*to(cuda, c, scores), 0.5, None if g is None else g.cuda())
            assert_equal(mask, mask_op(c, scores, 0.5, g), what="keep_mask")


@pytest.mark.parametrize("radius", [0.01, 0.5, 2.0, 100.0])
def test_cuda_matches_cpu_dense_and_sparse(cuda, gen, radius):
    """From nothing suppressed to everything suppressed (all 64-box blocks empty but one)."""
    centers, scores, _ = detections(3000, gen, grid=8)
    assert_equal(nms_op(*to(cuda, centers, scores), radius), nms_op(centers, scores, radius))


@pytest.mark.sanitizer
@pytest.mark.parametrize("N", [0, 1, 5, 64, 65, 200])
def test_cuda_small_sanitizer(cuda, gen, N):
    centers, scores, groups = detections(N, gen, n_groups=2, grid=4)
    check_result(centers, scores, 0.6, groups, cuda)
    check_result(centers.double(), scores, 0.6, None, cuda)


@pytest.mark.slow
def test_cuda_rounds_state_in_global_memory(cuda, gen):
    """The grid path at 262k and 1M boxes: the decisions on many blocks of a cooperative launch,
    boxes crowded in few buckets. Boxes in 300 tight clusters keep the CPU comparison quick."""
    for N, variants in ((4097 * 64 + 3, (PATH["auto"], PATH["grid"])), (2**20 + 77, (PATH["auto"],))):
        cluster = torch.randint(0, 300, (N,), generator=gen)
        centers = (torch.rand(300, 2, generator=gen)[cluster] * 1000
                   + torch.rand(N, 2, generator=gen) * 0.1)
        scores = torch.rand(N, generator=gen)
        groups = torch.randint(0, 2, (N,), generator=gen)
        want = cpu_variant(centers, scores, 1.0, groups)
        for variant in variants:
            got = variant_op(centers.cuda(), scores.cuda(), 1.0, groups.cuda(), variant)
            for a, b in zip(got, want):
                assert_equal(a, b, what=f"N={N}, variant {variant}")
            del got
            torch.cuda.empty_cache()


def test_cuda_deterministic(cuda, gen):
    centers, scores, groups = detections(10000, gen, n_groups=3, grid=8)
    c, s, g = to(cuda, centers, scores, groups)
    a, b = nms_op(c, s, 0.5, -1, g), nms_op(c, s, 0.5, -1, g)
    assert torch.equal(a, b)
    assert torch.equal(mask_op(c, s, 0.5, g), mask_op(c, s, 0.5, g))


def test_cuda_side_stream(cuda, gen):
    """Inputs written late on a side stream and the ops issued on it: launching on any other
    stream would read the inputs before they are written."""
    centers, scores, groups = detections(3000, gen, n_groups=2)
    expected = nms_op(centers, scores, 0.5, -1, groups)
    src = to(cuda, centers, scores, groups)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c, s, g = [torch.zeros_like(t) for t in src]
        torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time before the inputs are written
        for dst, t in zip((c, s, g), src):
            dst.copy_(t)
        keep = nms_op(c, s, 0.5, -1, g)
        mask = mask_op(c, s, 0.5, g)
    side.synchronize()
    assert_equal(keep, expected)
    assert_equal(torch.nonzero(mask).flatten(), expected.sort().values)


# the dataflow path (a cooperative launch) and the grid path
@pytest.mark.parametrize("N", [1000, 3000, 5000])
def test_cuda_mask_graph_capture(cuda, gen, N):
    centers, scores, groups = detections(N, gen, n_groups=2)
    c, s, g = to(cuda, centers, scores, groups)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph wants
        mask_op(c, s, 0.5, g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask = mask_op(c, s, 0.5, g)
    for _ in range(2):  # replays see new data in the captured input buffers
        new_c, new_s, new_g = detections(N, gen, n_groups=2)
        c.copy_(new_c)
        s.copy_(new_s)
        g.copy_(new_g)
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(mask, mask_op(new_c, new_s, 0.5, new_g))


def test_cuda_nms_refuses_graph_capture(cuda, gen):
    """circle_nms waits for its count on the host, which a captured launch never writes: a
    clear error instead of a hang (circle_nms_mask is the op for graphs)."""
    c, s, g = to(cuda, *detections(500, gen, n_groups=2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        nms_op(c, s, 0.5, -1, g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    refused = r"pcops\.circle_nms: cannot be captured in a CUDA graph"
    with pytest.raises(RuntimeError, match=refused):
        with torch.cuda.graph(graph):
            nms_op(c, s, 0.5, -1, g)
    torch.cuda.synchronize()
    assert_equal(nms_op(c, s, 0.5, -1, g), nms_op(*to("cpu", c, s), 0.5, -1, g.cpu()))


@pytest.mark.parametrize("delay", [0, 2_000_000])  # GPU clocks of torch.cuda._sleep first
def test_cuda_nms_count_wait(cuda, gen, delay):
    """circle_nms polls the count its kernel writes, and past a short time hands the wait to
    the runtime (a long kernel, or one that starts late): the CPU's answer either way, call
    after call (one count slot per thread), on the default and on a side stream."""
    side = torch.cuda.Stream()
    for N in (10, 3000, 200_000):
        centers, scores, groups = detections(N, gen, n_groups=3)
        want = nms_op(centers, scores, 0.5, -1, groups)
        c, s, g = to(cuda, centers, scores, groups)
        side.wait_stream(torch.cuda.current_stream())
        for stream in (torch.cuda.current_stream(), side):
            with torch.cuda.stream(stream):
                if delay:
                    torch.cuda._sleep(delay)
                keep = nms_op(c, s, 0.5, -1, g)
                top = nms_op(c, s, 0.5, 7, g)
            stream.synchronize()
            assert_equal(keep, want, what=f"N={N}")
            assert_equal(top, want[:7], what=f"N={N}, max_out 7")


def test_cuda_mask_does_not_synchronise(cuda, gen):
    centers, scores, groups = detections(5000, gen, n_groups=2)
    c, s, g = to(cuda, centers, scores, groups)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mask = mask_op(c, s, 0.5, g)
        mask_none = mask_op(c, s, 0.5)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_equal(mask, mask_op(centers, scores, 0.5, groups))
    assert_equal(mask_none, mask_op(centers, scores, 0.5))
    # circle_nms synchronises once, by design
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            nms_op(c, s, 0.5, -1, g)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_cuda_compile_reduce_overhead(cuda, gen):
    """circle_nms_mask inside a CUDA-graphed compiled function, next to stock ops."""
    centers, scores, groups = detections(2000, gen, n_groups=3)
    c, s, g = to(cuda, centers, scores, groups)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, mode="reduce-overhead")
    def post(c, s, g):
        keep = pcops.circle_nms_mask(c * 1.0, s.sigmoid(), 0.5, g)
        return torch.where(keep, s, -1.0)

    for _ in range(3):  # the third call replays the graph
        out = post(c, s, g).clone()
        expected = torch.where(mask_op(c, s.sigmoid(), 0.5, g), s, -1.0)
        assert_equal(out, expected)
        c = c + 0.1  # new inputs each time
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# bad inputs: each raises a Python exception naming the op and the argument


def _bad_cases(device):
    c = torch.rand(10, 3, device=device)
    s = torch.rand(10, device=device)
    g = torch.zeros(10, dtype=torch.long, device=device)
    return [
        ((torch.rand(10, device=device), s, 1.0), ValueError, r"'centers' must be a tensor of shape \[N, 2\] or \[N, 3\], got a 1-D"),
        ((torch.rand(10, 4, device=device), s, 1.0), ValueError, r"'centers' must be a tensor of shape \[N, 2\] or \[N, 3\], got a 2-D Float tensor of shape \[10, 4\]"),
        ((torch.rand(10, 1, device=device), s, 1.0), ValueError, r"'centers' must be a tensor of shape \[N, 2\] or \[N, 3\]"),
        ((torch.rand(2, 10, 3, device=device), s, 1.0), ValueError, r"'centers' must be a tensor of shape"),
        ((torch.ones(10, 3, dtype=torch.int64, device=device), s, 1.0), TypeError, r"'centers' must be a floating point"),
        ((torch.ones(10, 3, dtype=torch.bool, device=device), s, 1.0), TypeError, r"'centers' must be a floating point"),
        ((c, torch.rand(9, device=device), 1.0), ValueError, r"'scores' must have 10 \(the number of boxes N of 'centers'\) in dimension 0, got .*\[9\]"),
        ((c, torch.rand(10, 1, device=device), 1.0), ValueError, r"'scores' must be a tensor of shape \[N\], got a 2-D"),
        ((c, torch.ones(10, dtype=torch.int32, device=device), 1.0), TypeError, r"'scores' must be a floating point"),
        ((c, s, 0.0), ValueError, r"'radius' must be finite and > 0, got 0"),
        ((c, s, -1.0), ValueError, r"'radius' must be finite and > 0, got -1"),
        ((c, s, float("inf")), ValueError, r"'radius' must be finite and > 0, got inf"),
        ((c, s, float("nan")), ValueError, r"'radius' must be finite and > 0, got nan"),
        ((c, s, 1.0, g.int()), TypeError, r"'groups' must be an int64 tensor, got a 1-D Int tensor"),
        ((c, s, 1.0, g.float()), TypeError, r"'groups' must be an int64 tensor"),
        ((c, s, 1.0, g[:9]), ValueError, r"'groups' must have 10 \(the number of boxes N of 'centers'\)"),
        ((c, s, 1.0, g.view(2, 5)), ValueError, r"'groups' must be a tensor of shape \[N\], got a 2-D"),
    ]


@pytest.mark.parametrize("case", range(17))
@pytest.mark.parametrize("op", ["circle_nms", "circle_nms_mask"])
def test_bad_inputs_raise(device, case, op):
    args, exc, pattern = _bad_cases(device)[case]
    with pytest.raises(exc, match=rf"pcops\.{op}: .*" + pattern):
        if op == "circle_nms":
            nms_op(*args[:3], -1, *args[3:])
        else:
            mask_op(*args)


def test_cuda_too_many_boxes_raise(cuda):
    N = 65535 * 64 + 1  # PCOPS_CIRCLE_NMS_CUDA_MAX + 1
    c, s = torch.zeros(N, 2, device=cuda), torch.zeros(N, device=cuda)
    for op in (nms_op, mask_op):
        with pytest.raises(ValueError, match=r"pcops\.circle_nms(_mask)?: argument 'centers' must hold at most 4194240 boxes on CUDA"):
            op(c, s, 1.0)


def test_mixed_devices_raise(cuda):
    c, s, g = torch.rand(10, 3), torch.rand(10), torch.zeros(10, dtype=torch.long)
    for op in (lambda *a: nms_op(*a[:3], -1, *a[3:]), mask_op):
        with pytest.raises(ValueError, match=r"pcops\.circle_nms(_mask)?: argument 'scores' must be on the same device as 'centers'"):
            op(c.cuda(), s, 1.0)
        with pytest.raises(ValueError, match=r"pcops\.circle_nms(_mask)?: .*'centers' is .* while another argument is on CUDA"):
            op(c, s.cuda(), 1.0)
        with pytest.raises(ValueError, match=r"pcops\.circle_nms(_mask)?: argument 'groups' must be on the same device as 'centers'"):
            op(c.cuda(), s.cuda(), 1.0, g)
        with pytest.raises(ValueError, match=r"'centers' is .* while another argument is on CUDA"):
            op(c, s, 1.0, g.cuda())


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_gpu(gen):
    centers, scores, groups = detections(1000, gen, n_groups=2)
    keep = nms_op(*to("cuda:1", centers, scores, groups)[:2], 0.5, -1, groups.to("cuda:1"))
    assert keep.device == torch.device("cuda:1")
    assert_equal(keep, nms_op(centers, scores, 0.5, -1, groups))


# ---------------------------------------------------------------------------------------------
# every path gives the same bits: the CPU (sweep), the CUDA grid path, the CUDA block path
# (N <= 4096) and the CUDA flow path (N <= 4096), each forced through the internal op's
# argument


def path_cases(gen):
    """(name, centers, scores, radius, groups): ties, duplicates, groups, edge radii, non-finite
    values, N around the single-block limit."""
    cases = []
    for N in [0, 1, 2, 63, 64, 65, 1000, 2048, 2049, BLOCK_MAX - 1, BLOCK_MAX, BLOCK_MAX + 1]:
        c, s, g = detections(N, gen, n_groups=3)
        cases.append((f"uniform N={N} groups", c, s, 0.5, g))
        cases.append((f"uniform N={N}", c, s, 0.5, None))
    # scores on a few levels (many ties), centres on a grid (distances equal to the radius)
    c, s, g = detections(3000, gen, n_groups=2, grid=4)
    s = torch.round(s * 4) / 4
    cases.append(("ties, grid, radius 0.5 (= grid distances)", c, s, 0.5, g))
    cases.append(("ties, grid, radius 0.25", c, s, 0.25, None))
    # duplicates: every centre three times, scores tied in pairs
    c, s, _ = detections(700, gen)
    cases.append(("duplicates", c.repeat(3, 1), torch.round(s.repeat(3) * 8) / 8, 0.5, None))
    # all at one point; one tight cluster; a huge and a tiny radius
    cases.append(("one point", torch.zeros(500, 2), torch.rand(500, generator=gen), 1.0, None))
    c, s, _ = detections(2000, gen)
    cases.append(("radius 1e20 (r2 inf in float32)", c, s, 1e20, None))
    cases.append(("radius 1e-30 (r2 0 in float32)", c, s, 1e-30, None))
    cases.append(("radius 30 (most removed)", c, s, 30.0, None))
    # NaN / -0.0 scores, non-finite and far-out centres, negative coordinates, elongated scene
    c, s, g = detections(1500, gen, n_groups=2)
    s[::7] = float("nan")
    s[1::11] = -0.0
    s[2::11] = 0.0
    c[3::13, 0] = float("nan")
    c[4::17, 1] = float("inf")
    c[5::19, 0] = -float("inf")
    c[6] = torch.tensor([1e30, -1e30, 0.0])
    c[7] = torch.tensor([1e30, -1e30, 0.0])  # a duplicate far out
    c[:, :2] -= 20.0
    cases.append(("NaN/-0 scores, non-finite and far-out centres", c, s, 0.5, g))
    c, s, _ = detections(3500, gen)
    c[:, 0] *= 50.0
    c[:, 1] /= 50.0
    cases.append(("elongated", c, s, 0.5, None))
    # chains: boxes on a line 0.45 apart (radius 0.5), visited along it, so that each box's
    # fate waits on the one before (the in-order pass after the rounds), and a zigzag of two
    # interleaved lines visited in random order
    # 4096 + 1000: the grid path's rounds on the whole GPU too
    for N in (2000, 3000, BLOCK_MAX + 1000):
        c = torch.zeros(N, 3)
        c[:, 0] = torch.arange(N, dtype=torch.float32) * 0.45
        s = torch.linspace(1.0, 0.0, N)
        cases.append((f"chain N={N}", c, s, 0.5, None))
    c = torch.zeros(5000, 3)
    c[:, 0] = torch.arange(5000, dtype=torch.float32) * 0.3
    c[1::2, 1] = 0.35
    cases.append(("zigzag, random scores", c, torch.rand(5000, generator=gen), 0.5, None))
    # clusters of many boxes (more preds than the grid path stores per box), with groups
    objects = torch.rand(150, 2, generator=gen, dtype=torch.float64) * 40
    which = torch.randint(0, 150, (7000,), generator=gen)
    xy = objects[which] + torch.randn(7000, 2, generator=gen, dtype=torch.float64) * 0.4
    c = torch.cat([xy, torch.zeros(7000, 1, dtype=torch.float64)], 1).float()
    g = torch.randint(0, 2, (7000,), generator=gen)
    cases.append(("clusters, groups", c, torch.rand(7000, generator=gen), 0.5, g))
    cases.append(("clusters", c[:4000], torch.rand(4000, generator=gen), 0.5, None))
    # float64 scores that differ only below float32's resolution (equal once rounded)
    c, _, _ = detections(2000, gen, density=20.0)
    s = 0.5 + torch.randperm(2000, generator=gen).double() * 1e-13
    cases.append(("float64 score differences below float32", c, s, 0.5, None))
    return cases


def cpu_variant(c, s, radius, g):
    mask, idx, n = variant_op(c, s, radius, g, 0)
    return mask, idx, n


def test_variant_op_on_cpu_is_the_public_ops(gen):
    for name, c, s, radius, g in path_cases(gen):
        for dtype in (torch.float32, torch.float64):
            cd = c.to(dtype)
            mask, idx, n = cpu_variant(cd, s, radius, g)
            keep = nms_op(cd, s, radius, -1, g)
            K = int(n)
            assert_equal(idx[:K], keep, what=f"keep_idx, {name}, {dtype}")
            assert (idx[K:] == -1).all(), name
            assert_equal(mask, mask_op(cd, s, radius, g), what=f"keep_mask, {name}, {dtype}")


def test_path_op_on_cpu_has_one_path():
    c, s = torch.rand(10, 2), torch.rand(10)
    _, idx, n = variant_op(c, s, 1.0, None, PATH["sweep"])
    assert_equal(idx[:int(n)], nms_op(c, s, 1.0))
    for variant in (PATH["grid"], PATH["block"], PATH["flow"]):
        with pytest.raises(ValueError, match=r"pcops\._circle_nms_path: path '\w+' does not run on the CPU"):
            variant_op(c, s, 1.0, None, variant)
    with pytest.raises(ValueError, match=r"pcops\._circle_nms_path: argument 'path' must be a path id"):
        variant_op(c, s, 1.0, None, -1)


def test_visiting_order_matches_a_stable_descending_sort(gen):
    """The kernels sort the scores themselves now: their order is torch.sort(descending=True,
    stable=True)'s, NaN first and -0.0 equal to +0.0, for float32 and float64 scores. With a
    radius that removes nothing, keep is exactly the visiting order."""
    for dtype in (torch.float32, torch.float64):
        s = torch.round(torch.randn(5000, generator=gen, dtype=torch.float64) * 3).to(dtype)
        s[::9] = float("nan")
        s[1::13] = -0.0
        s[2::13] = 0.0
        s[3::17] = float("inf")
        s[4::19] = -float("inf")
        c = torch.arange(5000, dtype=torch.float32)[:, None].repeat(1, 2) * 10
        expected = torch.sort(s, descending=True, stable=True).indices
        assert_equal(nms_op(c, s, 1.0), expected, what=f"order, {dtype}")
    # float64 scores equal in float32: the order follows the float64 values
    s = 0.5 + torch.randperm(5000, generator=gen).double() * 1e-13
    assert len(torch.unique(s.float())) < 10
    expected = torch.sort(s, descending=True, stable=True).indices
    assert_equal(nms_op(c, s, 1.0), expected, what="order, float64 below float32 resolution")


@pytest.mark.parametrize("score_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_every_path_matches_cpu(cuda, gen, dtype, score_dtype):
    for name, c, s, radius, g in path_cases(gen):
        c, s = c.to(dtype), s.to(score_dtype)
        want_mask, want_idx, want_n = cpu_variant(c, s, radius, g)
        variants = ([PATH["auto"], PATH["grid"]] + ([PATH["block"]] if len(c) <= BLOCK_MAX else [])
                    + ([PATH["flow"]] if len(c) <= FLOW_MAX else []))
        for variant in variants:
            mask, idx, n = variant_op(*to(cuda, c, s)[:2], radius,
                                      None if g is None else g.cuda(), variant)
            what = f"{name}, variant {variant}, {dtype}, scores {score_dtype}"
            assert_equal(n, want_n, what="num_kept, " + what)
            assert_equal(idx, want_idx, what="keep_idx, " + what)
            assert_equal(mask, want_mask, what="keep_mask, " + what)


def test_cuda_single_block_limit(cuda, gen):
    c, s = torch.rand(BLOCK_MAX + 1, 2, device=cuda), torch.rand(BLOCK_MAX + 1, device=cuda)
    with pytest.raises(ValueError, match=r"pcops\._circle_nms_path: path 'block' cannot take these inputs \(N = 4097\)"):
        variant_op(c, s, 1.0, None, PATH["block"])
    with pytest.raises(ValueError, match=r"path 'flow' cannot take these inputs \(N = 4097\)"):
        variant_op(c, s, 1.0, None, PATH["flow"])
    with pytest.raises(ValueError, match=r"path 'sweep' does not run on CUDA"):
        variant_op(c[:10], s[:10], 1.0, None, PATH["sweep"])
    for bad in (-1, len(PATH)):
        with pytest.raises(ValueError, match=r"argument 'path' must be a path id"):
            variant_op(c[:10], s[:10], 1.0, None, bad)


@pytest.mark.parametrize("N", [1, 2, 255, 2049, 16384, 16385])
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.float64, torch.float16])
def test_cuda_grid_score_sort_sizes(cuda, gen, N, score_dtype):
    """The grid path's stable score sort (cub's radix sort of the score keys): scores on a few
    levels (ties must keep the lower index first), NaN, infinite and negative zero scores, in
    every score dtype; the CPU's answer bit for bit."""
    c, _, g = detections(N, gen, n_groups=2, grid=4)
    s = torch.randint(0, 7, (N,), generator=gen).to(score_dtype) / 4
    if N > 8:
        s[torch.randint(0, N, (4,), generator=gen)] = torch.tensor(
            [float("nan"), float("inf"), -float("inf"), -0.0], dtype=score_dtype)
    want = cpu_variant(c, s, 0.6, g)
    got = variant_op(*to(cuda, c, s)[:2], 0.6, g.cuda(), PATH["grid"])
    for a, b in zip(got, want):
        assert_equal(a, b)


@pytest.mark.sanitizer
@pytest.mark.parametrize("variant", [PATH["grid"], PATH["block"], PATH["flow"]])
@pytest.mark.parametrize("N", [1, 65, 700, 2100])  # 2100: a 4096-key sort by 1024 threads
def test_cuda_paths_sanitizer(cuda, gen, variant, N):
    c, s, g = detections(N, gen, n_groups=2, grid=4)
    want = cpu_variant(c, s, 0.6, g)
    got = variant_op(*to(cuda, c, s)[:2], 0.6, g.cuda(), variant)
    for a, b in zip(got, want):
        assert_equal(a, b)


@pytest.mark.sanitizer
@pytest.mark.parametrize("case", ["uniform", "chain", "dense", "one spot"])
def test_cuda_grid_rounds_sanitizer(cuda, gen, case):
    """The grid path above 4096 boxes: its rounds (uniform), the in-order finish (a chain of
    boxes, each waiting on the one before), crowded buckets (dense: every box within the radius
    of hundreds; one spot: every box in one bucket)."""
    N = 4500
    c, s, g = detections(N, gen, n_groups=2, grid=4)
    radius = 0.6
    if case == "chain":
        c = torch.zeros(N, 3)
        c[:, 0] = torch.arange(N, dtype=torch.float32) * 0.5
        s, g = torch.linspace(1.0, 0.0, N), None
    elif case == "dense":
        c = c / 20.0
    elif case == "one spot":
        c = torch.full((N, 3), 5.0)
    want = cpu_variant(c, s, radius, g)
    got = variant_op(*to(cuda, c, s)[:2], radius, None if g is None else g.cuda(), 0)
    for a, b in zip(got, want):
        assert_equal(a, b, what=case)


@pytest.mark.sanitizer
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("N", [97, 1000, 4096])
def test_cuda_block_modes_sanitizer(cuda, gen, dense, N):
    """The block path in both scan modes: the pred lists in shared memory (sparse) and the push
    scan (dense: every box within the radius of every other, far more pairs than fit), float64
    centres and scores with groups (the least room for the lists), scores in visiting order
    (no sort) and not; the flow path on the same inputs."""
    c, s, g = detections(N, gen, n_groups=2, grid=4)
    radius = 1e3 if dense else 0.6
    sorted_s = torch.sort(s, descending=True).values
    for cc, ss, gg in ((c, s, g), (c.double(), s.double(), g), (c, s, None), (c, sorted_s, g)):
        want = cpu_variant(cc, ss, radius, gg)
        for variant in (PATH["block"], PATH["flow"]):
            got = variant_op(*to(cuda, cc, ss)[:2], radius, None if gg is None else gg.cuda(),
                             variant)
            for a, b in zip(got, want):
                assert_equal(a, b, what=f"variant {variant}, N={N}, dense={dense}, {cc.dtype}, "
                             f"scores {ss.dtype}")


def block_cases(gen, N):
    """(name, centers, scores, groups) at size N for the single-block paths: CenterPoint-like
    clusters with groups, tied scores on a grid, duplicates, non-finite values, one dense spot."""
    objects = torch.rand(max(N // 8, 1), 2, generator=gen, dtype=torch.float64) * math.sqrt(N) * 2
    which = torch.randint(0, len(objects), (N,), generator=gen)
    xy = objects[which] + torch.randn(N, 2, generator=gen, dtype=torch.float64) * 0.3
    clustered = torch.cat([xy, torch.zeros(N, 1, dtype=torch.float64)], 1).float()
    scores = torch.rand(N, generator=gen)
    groups = torch.randint(0, 3, (N,), generator=gen)
    cases = [("clustered, groups", clustered, scores, groups), ("clustered", clustered, scores, None)]
    c, s, _ = detections(N, gen, grid=4)
    cases.append(("grid, tied scores", c, torch.round(s * 8) / 8, None))
    c, s, g = detections(N, gen, n_groups=2)
    s = s.clone()
    s[::5] = float("nan")
    s[1::7] = -0.0
    s[2::7] = 0.0
    c = c.clone()
    c[3::11, 0] = float("nan")
    c[4::13, 1] = float("inf")
    c[::17] = c[0].clone()  # duplicates of box 0
    cases.append(("non-finite, duplicates, groups", c, s, g))
    c, s, _ = detections(N, gen)
    c = c.clone()
    c[: N // 2] = c[: N // 2] * 1e-3  # half of the boxes in one dense spot
    cases.append(("dense spot", c, s, None))
    # scores already in visiting order (the block path skips its sort), NaN first and ties; and the
    # same with one neighbouring pair out of order (the sort runs)
    c, s, g = detections(N, gen, n_groups=2)
    s = torch.sort(torch.round(s * 8) / 8, descending=True).values
    s[: N // 10] = float("nan")
    cases.append(("scores in visiting order, NaN first, ties, groups", c, s, g))
    s = torch.linspace(1.0, 0.0, N)
    if N > 2:
        s[[N // 3, N // 3 + 1]] = s[[N // 3 + 1, N // 3]]
    cases.append(("scores in order but for one pair", c, s, None))
    return cases


@pytest.mark.parametrize("N", [1, 2, 31, 33, 63, 64, 65, 100, 127, 129, 255, 257, 500, 511, 513,
                               1000, 1023, 1025, 2047, 2049, 3000, 4095, 4096])
def test_cuda_block_and_flow_match_cpu(cuda, gen, N):
    """The flow path (the default up to 4096 boxes), the block path (its fallback) and the grid
    path give the bits of the CPU on every size around the warp, block and sort sizes, on
    clustered, tied, grouped, duplicated and non-finite inputs, both centre and score dtypes."""
    for name, c, s, g in block_cases(gen, N):
        for dtype, score_dtype in ((torch.float32, torch.float32), (torch.float64, torch.float64),
                                   (torch.float32, torch.float64)):
            cc, ss = c.to(dtype), s.to(score_dtype)
            for radius in (0.5, 2.0):
                want = cpu_variant(cc, ss, radius, g)
                args = (*to(cuda, cc, ss)[:2], radius, None if g is None else g.cuda())
                what = f"{name}, N={N}, {dtype}, scores {score_dtype}, radius {radius}"
                for path in ("block", "flow", "grid"):
                    got = variant_op(*args, PATH[path])
                    for a, b, part in zip(got, want, ("keep_mask", "keep_idx", "num_kept")):
                        assert_equal(a, b, what=f"{part} of path {path} vs cpu, {what}")


def test_variant_opcheck(device, gen):
    c, s, g = to(device, *detections(150, gen, n_groups=2))
    torch.library.opcheck(variant_op, (c, s, 0.5, g, 0))
    if device == "cuda":
        torch.library.opcheck(variant_op, (c, s, 0.5, None, PATH["grid"]))
        torch.library.opcheck(variant_op, (c, s, 0.5, g, PATH["block"]))
        torch.library.opcheck(variant_op, (c, s, 0.5, g, PATH["flow"]))
    else:
        torch.library.opcheck(variant_op, (c, s, 0.5, g, PATH["sweep"]))


# ---------------------------------------------------------------------------------------------
# hard layouts (issue 34): structures sized from the extent of the boxes, or sorted along one
# axis, degrade on these (a line and a far box: one axis, or huge cells; one spot and dense
# clusters: every pair of a cluster). Every layout keeps the greedy's boxes, on every path; their
# times are in benchmarks/bench_nms_layouts.py.


def layout_cases(gen, N):
    """(name, centres [N, 2] float32, scores [N], radius, groups) of the hard layouts, drawn from
    `gen`, with and without groups, ties and NaN scores."""
    u = lambda *shape: torch.rand(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    side = math.sqrt(N)
    cases = []

    def add(name, xy, radius=1.0, scores=None, groups=None):
        cases.append((name, xy.float(), u(N).float() if scores is None else scores, radius,
                      groups))

    add("uniform", u(N, 2) * side)
    line = torch.zeros(N, 2, dtype=torch.float64)
    line[:, 0] = u(N) * N
    add("line", line)
    far = line.clone()
    far[0, 1] = 10.0 * N
    add("line and a far box", far)
    t = u(N) * N
    add("diagonal line and a far box", torch.stack([t, 0.7 * t + 3.0], 1).index_put_(
        (torch.tensor([0]),), torch.tensor([[-1e6, 1e6]], dtype=torch.float64)))
    two = u(N, 2) * math.sqrt(N / 2)
    two[N // 2:] += 1e5
    add("two far clusters", two)
    add("one spot", torch.full((N, 2), 5.0, dtype=torch.float64))
    sign = torch.where(u(N, 2) < 0.5, -1.0, 1.0)
    add("exponentially spread", sign * torch.exp(u(N, 2) * 40.0 - 20.0))
    k = max(N // 100, 1)
    centres = u(k, 2) * 3.0 * math.sqrt(k)
    dense = centres[torch.arange(N) % k] + torch.randn(N, 2, generator=gen, dtype=torch.float64) * 0.2
    add("dense clusters", dense)
    chain = torch.zeros(N, 2, dtype=torch.float64)
    chain[:, 0] = torch.arange(N, dtype=torch.float64) * 0.45
    add("line visited along it", chain, 0.5, torch.linspace(1.0, 0.0, N))
    # groups (a cluster of every group in the same spot), tied scores, NaN scores
    g = torch.randint(0, 5, (N,), generator=gen)
    add("one spot, 5 groups", torch.full((N, 2), 5.0, dtype=torch.float64), groups=g)
    s = torch.round(u(N) * 8).float() / 8
    s[::11] = float("nan")
    add("line and a far box, 3 groups, ties, NaN", far, scores=s,
        groups=torch.randint(0, 3, (N,), generator=gen))
    add("dense clusters, 2 groups, ties", dense, scores=torch.round(u(N) * 4).float() / 4,
        groups=torch.randint(0, 2, (N,), generator=gen))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_layouts_match_reference(device, gen, dtype):
    """Each hard layout against the reference, exactly, through the public ops (AUTO) and every
    path of the device forced (N = 2500: the CUDA block and flow paths can take it too)."""
    paths = ["sweep"] if device == "cpu" else ["grid", "block", "flow"]
    for name, c, s, radius, g in layout_cases(gen, 2500):
        c = c.to(dtype)
        expected = reference_for(c, s, radius, g)
        try:
            check_result(c, s, radius, g, device, expected)
        except AssertionError as e:
            raise AssertionError(f"{name}, {dtype}: {e}") from None
        cd, sd, gd = to(device, c, s, g)
        for path in paths:
            _, idx, n = variant_op(cd, sd, radius, gd, PATH[path])
            assert idx[:int(n)].cpu().tolist() == expected, f"{name}, {dtype}, path {path}"
            assert (idx[int(n):] == -1).all(), f"{name}, {dtype}, path {path}"


def test_hard_layouts_greedy_properties(gen):
    """The CPU at N = 6000 (many rows, long rows, a row per box) checked in float64 against the
    greedy's definition: kept boxes apart, removed boxes covered."""
    for name, c, s, radius, g in layout_cases(gen, 6000):
        if name.startswith("exponentially"):
            continue  # float32 rounding of coordinates up to 5e8 leaves rtol no margin
        keep = nms_op(c, s, radius, -1, g)
        problems = greedy_violations(c, s, radius, keep, g)
        assert not problems, f"{name}: {problems[:5]}"


def test_hard_layouts_cost_follows_n():
    """Not a timing test: the layouts on which the earlier CPU sweep cost O(N**2) (a line and a
    box off its axis: 333 s at 10**6 boxes, a line plus a far box on a diagonal likewise) at
    10**6 boxes must finish in a child process within 120 s; they take about a second now (the
    margin is two orders of magnitude either way)."""
    code = """
import math, torch, pcops
n = 1_000_000
g = torch.Generator().manual_seed(1)
line = torch.zeros(n, 2, dtype=torch.float64)
line[:, 0] = torch.rand(n, generator=g, dtype=torch.float64) * n
line[0, 1] = 10.0 * n
t = torch.rand(n, generator=g, dtype=torch.float64) * n
diag = torch.stack([t, 0.7 * t + 3.0], 1)
diag[0] = torch.tensor([-1e6, 1e6])
for xy in (line, diag):
    keep = pcops.circle_nms(xy.float(), torch.rand(n, generator=g), 1.0)
    assert 0.3 * n < len(keep) < 0.7 * n, len(keep)
print("ok")
"""
    import subprocess
    import sys
    root = __import__("os").path.dirname(__import__("os").path.dirname(pcops.__file__))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("N", [3000, 5000, 100_000, 300_000])
def test_cuda_hard_layouts_match_cpu(cuda, gen, N):
    """The CUDA paths on the hard layouts, bit for bit against the CPU: AUTO (the flow path up to
    4096 boxes, the grid path above), the grid path forced, the block and flow paths forced
    (N <= 4096); float32 and float64 centres."""
    for name, c, s, radius, g in layout_cases(gen, N):
        for dtype in (torch.float32, torch.float64):
            cc = c.to(dtype)
            want = cpu_variant(cc, s, radius, g)
            paths = ["auto", "grid"] + (["block", "flow"] if N <= BLOCK_MAX else [])
            for path in paths:
                got = variant_op(*to(cuda, cc, s)[:2], radius, None if g is None else g.cuda(),
                                 PATH[path])
                for a, b, part in zip(got, want, ("keep_mask", "keep_idx", "num_kept")):
                    assert_equal(a, b, what=f"{part}, {name}, N={N}, {dtype}, path {path}")


@pytest.mark.slow
def test_cuda_hard_layouts_million(cuda, gen):
    """The grid path at 10**6 boxes on the hard layouts, against the CPU."""
    for name, c, s, radius, g in layout_cases(gen, 1_000_000):
        want = cpu_variant(c, s, radius, g)
        got = variant_op(*to(cuda, c, s)[:2], radius, None if g is None else g.cuda(), 0)
        for a, b, part in zip(got, want, ("keep_mask", "keep_idx", "num_kept")):
            assert_equal(a, b, what=f"{part}, {name}")
