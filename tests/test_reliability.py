"""No silent wrong answer (issue 34): derivatives in every mode, devices in the fake (meta)
implementations, the value check of FPS's start in the op itself, and messages that name the op
and the argument.

Derivatives are checked against finite differences (gradcheck in float64, forward mode and
batched gradients included) and against independent references written with plain torch ops
(the same transforms applied to them), on the indices the op returned.
"""
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.autograd import forward_ad as fwAD

import pcops
from helpers import assert_close, assert_equal, rand_points

F64 = torch.float64


# ---------------------------------------------------------------------------------------------
# independent references (plain torch, float64), for given neighbour indices


def gather_rows(x, idx):
    """x[b, idx[b, m, s], :] with zeros where idx is outside [0, N)."""
    B, N, _ = x.shape
    valid = (idx >= 0) & (idx < N)
    rows = x[torch.arange(B)[:, None, None], torch.where(valid, idx, 0).long()]
    return torch.where(valid.unsqueeze(-1), rows, 0.0)


def dist2_reference(q, r, idx, empty=0.0):
    """|q[b,m] - r[b, idx[b,m,s]]|**2, `empty` where idx is outside [0, N)."""
    valid = (idx >= 0) & (idx < r.shape[1])
    d = (q.unsqueeze(2) - gather_rows(r, idx)).square().sum(-1)
    return torch.where(valid, d, empty)


def group_backward_reference(g, idx, N):
    B, M, S, C = g.shape
    valid = (idx >= 0) & (idx < N)
    rows = torch.where(valid.unsqueeze(-1), g, 0.0).reshape(B, M * S, C)
    where = torch.where(valid, idx, 0).long().reshape(B, M * S, 1).expand(-1, -1, C)
    return g.new_zeros(B, N, C).scatter_add(1, where, rows)


def finite(d):
    """knn's +inf in empty slots as 0 (finite differences cannot take inf)."""
    return torch.where(torch.isfinite(d), d, 0.0)


def differentiable_cases(gen, device):
    """name -> (fn, reference, inputs): fn(*inputs) through a pcops wrapper, reference(*inputs)
    the same function in plain torch; inputs float64, the ones that are differentiated."""
    q = rand_points(2, 6, gen, dtype=F64, device=device)
    r = rand_points(2, 9, gen, dtype=F64, device=device)
    ql = torch.tensor([6, 4], device=device)
    rl = torch.tensor([9, 3], device=device)  # k = 5 > 3: empty slots in cloud 1
    _, knn_idx = pcops.knn(q, r, 5, ql, rl)
    _, nn3_idx = pcops.three_nn(q, r)
    _, knn2_idx = pcops.knn(q[0], r[0], 4)
    _, bq_idx = pcops.ball_query_dist2(q, r, 0.6, 4, ql, rl)
    idx = torch.randint(-1, 9, (2, 6, 4), generator=gen).to(device)
    idx_any = idx.clone()
    idx_any[1, 2, 0], idx_any[0, 3, 1] = 9, -7  # neighbor_dist2 takes any value: 0 outside [0, N)
    feats = torch.randn(2, 9, 5, generator=gen, dtype=F64).to(device)
    w = torch.rand(2, 6, 4, generator=gen, dtype=F64).to(device)
    g = torch.randn(2, 6, 4, 5, generator=gen, dtype=F64).to(device)
    return {
        "knn": (lambda a, b: finite(pcops.knn(a, b, 5, ql, rl)[0]),
                lambda a, b: dist2_reference(a, b, knn_idx), (q, r)),
        "knn_2d": (lambda a, b: pcops.knn(a, b, 4)[0],
                   lambda a, b: dist2_reference(a[None], b[None], knn2_idx[None])[0],
                   (q[0], r[0])),
        "three_nn": (lambda a, b: pcops.three_nn(a, b)[0],
                     lambda a, b: dist2_reference(a, b, nn3_idx), (q, r)),
        "ball_query_dist2": (lambda a, b: pcops.ball_query_dist2(a, b, 0.6, 4, ql, rl)[0],
                             lambda a, b: dist2_reference(a, b, bq_idx), (q, r)),
        "neighbor_dist2": (lambda a, b: pcops.neighbor_dist2(a, b, idx_any),
                           lambda a, b: dist2_reference(a, b, idx_any), (q, r)),
        "group": (lambda f: pcops.group(f, idx), lambda f: gather_rows(f, idx), (feats,)),
        "group_backward": (lambda x: pcops.group_backward(x, idx, 9),
                           lambda x: group_backward_reference(x, idx, 9), (g,)),
        "interpolate": (lambda f, ww: pcops.interpolate(f, idx, ww),
                        lambda f, ww: (gather_rows(f, idx) * ww.unsqueeze(-1)).sum(2),
                        (feats, w)),
        "three_interpolate": (lambda f, ww: pcops.three_interpolate(f, nn3_idx, ww[:, :, :3]),
                              lambda f, ww: (gather_rows(f, nn3_idx)
                                             * ww[:, :, :3].unsqueeze(-1)).sum(2),
                              (feats, w)),
    }


CASES = ["knn", "knn_2d", "three_nn", "ball_query_dist2", "neighbor_dist2", "group",
         "group_backward", "interpolate", "three_interpolate"]


def close(a, b, what):
    assert_close(a, b, atol=1e-12, rtol=1e-12, what=what)


def tangents(inputs, gen):
    return tuple(torch.randn(x.shape, generator=gen, dtype=F64).to(x.device) for x in inputs)


# ---------------------------------------------------------------------------------------------
# derivatives: finite differences, references, every mode and transform


@pytest.mark.parametrize("case", CASES)
def test_values_match_reference(device, gen, case):
    fn, reference, inputs = differentiable_cases(gen, device)[case]
    close(fn(*inputs), reference(*inputs), f"{case} values")


@pytest.mark.parametrize("case", CASES)
def test_gradcheck_forward_and_batched(device, gen, case):
    """Reverse and forward mode against finite differences, and batched (vmapped) gradients and
    tangents against unbatched ones, in float64."""
    fn, _, inputs = differentiable_cases(gen, device)[case]
    xs = [x.clone().requires_grad_(True) for x in inputs]
    assert torch.autograd.gradcheck(fn, xs, check_forward_ad=True, check_batched_grad=True,
                                    check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(fn, xs, check_fwd_over_rev=True, check_batched_grad=True)


@pytest.mark.parametrize("case", CASES)
def test_func_transforms_match_reference(device, gen, case):
    """torch.func.jvp, grad, jacrev, jacfwd and hessian of the op equal those of the plain torch
    reference (never zeros, never torch's setup_context error)."""
    fn, reference, inputs = differentiable_cases(gen, device)[case]
    argnums = tuple(range(len(inputs)))
    v = tangents(inputs, gen)
    out, tangent = torch.func.jvp(fn, inputs, v)
    want_out, want_tangent = torch.func.jvp(reference, inputs, v)
    close(out, want_out, f"{case} jvp primal")
    close(tangent, want_tangent, f"{case} jvp tangent")
    assert tangent.abs().sum() > 0, "a zero tangent would pass against a broken reference"

    def loss(f):
        return lambda *a: f(*a).square().sum()

    for got, want in zip(torch.func.grad(loss(fn), argnums)(*inputs),
                         torch.func.grad(loss(reference), argnums)(*inputs)):
        close(got, want, f"{case} grad")
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        for got, want in zip(transform(fn, argnums)(*inputs),
                             transform(reference, argnums)(*inputs)):
            close(got, want, f"{case} {transform.__name__}")
    got = torch.func.hessian(loss(fn))(*inputs)
    close(got, torch.func.hessian(loss(reference))(*inputs), f"{case} hessian")


@pytest.mark.parametrize("case", CASES)
def test_forward_ad_dual_tensors_keep_their_tangent(device, gen, case):
    fn, reference, inputs = differentiable_cases(gen, device)[case]
    v = tangents(inputs, gen)
    _, want = torch.func.jvp(reference, inputs, v)
    with fwAD.dual_level():
        out = fn(*(fwAD.make_dual(x, t) for x, t in zip(inputs, v)))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None, f"{case}: the dual output lost its tangent"
    close(tangent, want, f"{case} forward-AD tangent")


@pytest.mark.parametrize("case", CASES)
def test_vmap_matches_a_loop(device, gen, case):
    """vmap over the op, over its grad, and grad over its vmap, against a Python loop; no
    fallback (its performance warning is an error here)."""
    fn, _, inputs = differentiable_cases(gen, device)[case]
    V = 3
    batch = [x.unsqueeze(0) + 0.05 * torch.randn(V, *x.shape, generator=gen, dtype=F64).to(device)
             for x in inputs]

    def loss(*a):
        return fn(*a).square().sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = torch.func.vmap(fn)(*batch)
        grads = torch.func.vmap(torch.func.grad(loss, tuple(range(len(inputs)))))(*batch)
        outer = torch.func.grad(lambda *a: torch.func.vmap(fn)(*a).square().sum())(*batch)
    assert_equal(got, torch.stack([fn(*(x[i] for x in batch)) for i in range(V)]),
                 what=f"{case} vmap")
    for j in range(len(inputs)):
        want = torch.stack([torch.func.grad(loss, j)(*(x[i] for x in batch)) for i in range(V)])
        close(grads[j], want, f"{case} vmap(grad)")
    close(outer, torch.stack([torch.func.grad(loss)(*(x[i] for x in batch))
                              for i in range(V)]), f"{case} grad(vmap)")


def test_issue_example_jvp_of_knn_is_not_zero(gen):
    """The issue's call: torch.func.jvp(lambda a: pcops.knn(a, r, 3)[0], (q,), (v,)) returned
    zeros."""
    q = rand_points(2, 10, gen, dtype=F64)
    r = rand_points(2, 30, gen, dtype=F64)
    v = torch.randn(q.shape, generator=gen, dtype=F64)
    _, idx = pcops.knn(q, r, 3)
    _, tangent = torch.func.jvp(lambda a: pcops.knn(a, r, 3)[0], (q,), (v,))
    want = (2 * (q.unsqueeze(2) - gather_rows(r, idx)) * v.unsqueeze(2)).sum(-1)
    close(tangent, want, "knn jvp")
    grad = torch.func.grad(lambda a: pcops.knn(a, r, 3)[0].sum())(q)
    close(grad, (2 * (q.unsqueeze(2) - gather_rows(r, idx))).sum(2), "knn func.grad")
    grad = torch.func.grad(lambda f: pcops.group(f, idx).sum())(r)
    close(grad, group_backward_reference(torch.ones(2, 10, 3, 3, dtype=F64), idx, 30),
          "group func.grad")


@pytest.mark.parametrize("name", ["knn", "group", "interpolate", "neighbor_dist2"])
def test_raw_ops_forward_ad_and_a_clear_error_under_func_transforms(gen, name):
    """torch.ops.pcops.<op> differentiates in reverse mode and with dual tensors; torch.func
    transforms reach the op's derivatives only through the wrapper, so the raw op raises under
    them (it used to return zero tangents)."""
    q, r = rand_points(2, 6, gen, dtype=F64), rand_points(2, 9, gen, dtype=F64)
    idx = torch.randint(-1, 9, (2, 6, 4), generator=gen)
    w = torch.rand(2, 6, 4, generator=gen, dtype=F64)
    raw = {
        "knn": (lambda a, b: torch.ops.pcops.knn.default(a, b, 3)[0], (q, r)),
        "group": (lambda f: torch.ops.pcops.group.default(f, idx), (r,)),
        "interpolate": (lambda f, ww: torch.ops.pcops.interpolate.default(f, idx, ww), (r, w)),
        "neighbor_dist2": (lambda a, b: torch.ops.pcops.neighbor_dist2.default(a, b, idx), (q, r)),
    }[name]
    wrapper = {
        "knn": lambda a, b: pcops.knn(a, b, 3)[0],
        "group": lambda f: pcops.group(f, idx),
        "interpolate": lambda f, ww: pcops.interpolate(f, idx, ww),
        "neighbor_dist2": lambda a, b: pcops.neighbor_dist2(a, b, idx),
    }[name]
    fn, inputs = raw
    v = tangents(inputs, gen)
    _, want = torch.func.jvp(wrapper, inputs, v)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fn(*(fwAD.make_dual(x, t) for x, t in zip(inputs, v)))).tangent
    close(tangent, want, f"raw {name} forward-AD tangent")
    xs = [x.clone().requires_grad_(True) for x in inputs]
    assert torch.autograd.gradcheck(fn, xs, check_forward_ad=True)
    message = rf"torch\.ops\.pcops\.{name}: torch\.func transforms .* pcops\.{name}"
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(fn, inputs, v)
    with pytest.raises(RuntimeError, match=message):
        torch.func.grad(lambda *a: fn(*a).sum())(*inputs)
    assert_equal(torch.func.vmap(fn)(*(x.unsqueeze(0).expand(2, *x.shape) for x in inputs))[1],
                 fn(*inputs), what=f"raw {name} under vmap")


def test_non_differentiable_ops_under_transforms(gen):
    """A PointNet++ grouping step (fps, ball_query: indices, no derivative) under grad, vmap of
    grad and jacfwd: the gradient of eager autograd."""
    x = rand_points(2, 20, gen, dtype=F64)

    def step(xyz):
        idx = pcops.furthest_point_sample(xyz, 5)
        centres = pcops.group(xyz, idx[:, :, None])[:, :, 0]
        neighbours = pcops.ball_query(centres, xyz, 0.5, 4)
        return (pcops.group(xyz, neighbours) - centres[:, :, None]).square().sum()

    xg = x.clone().requires_grad_(True)
    step(xg).backward()
    close(torch.func.grad(step)(x), xg.grad, "grad of a grouping step")
    close(torch.func.jacfwd(step)(x), xg.grad, "jacfwd of a grouping step")
    close(torch.func.vmap(torch.func.grad(step))(torch.stack([x, x]))[1], xg.grad,
          "vmap(grad) of a grouping step")


@pytest.mark.parametrize("op,call", [
    ("furthest_point_sample", lambda x: pcops.furthest_point_sample(x, 4, return_dist2=True)),
    ("ball_query", lambda x: pcops.ball_query(x, x, 0.4, 4, return_count=True)),
    ("three_nn_pointnet2", lambda x: torch.ops.pcops.three_nn_pointnet2.default(x, x)),
    ("circle_nms_mask", lambda x: (pcops.circle_nms_mask(x[0, :, :2], x[0, :, 2], 0.3),)),
])
def test_vmap_of_index_ops_matches_a_loop(gen, op, call):
    batch = torch.rand(3, 2, 12, 3, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no per-sample fallback
        got = torch.func.vmap(call)(batch)
    for j, out in enumerate(got):
        assert_equal(out, torch.stack([call(x)[j] for x in batch]), what=f"vmap {op} output {j}")


@pytest.mark.parametrize("op,call", [
    ("circle_nms", lambda x: pcops.circle_nms(x[:, :2], x[:, 2], 0.3)),
    ("neighbor_edges", lambda x: pcops.neighbor_edges(pcops.knn(x[None], x[None], 2)[1], 12)),
])
def test_vmap_of_data_dependent_sizes_raises(gen, op, call):
    with pytest.raises(RuntimeError, match=rf"pcops\.{op}: torch\.vmap is not supported"):
        torch.func.vmap(call)(torch.rand(3, 12, 3, generator=gen))


def test_compile_fullgraph_backward_matches_eager(gen):
    """torch.compile(fullgraph=True) of the wrappers, with a backward, gives eager's values and
    gradients (aot_eager: the traced autograd of the ops, without Inductor's codegen)."""
    q = rand_points(2, 16, gen)
    r = rand_points(2, 40, gen)
    feats = torch.randn(2, 40, 8, generator=gen)

    def step(a, b, f):
        d2, idx = pcops.knn(a, b, 4)
        w = 1.0 / (d2 + 1e-3)
        out = pcops.interpolate(f, idx, w / w.sum(-1, keepdim=True))
        grouped = pcops.group(f, idx)
        return out.square().sum() + grouped.sum() + pcops.neighbor_dist2(a, b, idx).sum()

    def run(fn):
        xs = [t.clone().requires_grad_(True) for t in (q, r, feats)]
        loss = fn(*xs)
        loss.backward()
        return [loss.detach()] + [x.grad for x in xs]

    eager = run(step)
    compiled = run(torch.compile(step, fullgraph=True, backend="aot_eager"))
    for a, b in zip(compiled, eager):
        assert_close(a, b, atol=1e-5, rtol=1e-5, what="compiled vs eager")


def test_inference_tensor_under_autograd_names_the_op_and_argument(gen):
    with torch.inference_mode():
        r = rand_points(2, 9, gen)
        idx = torch.randint(0, 9, (2, 4, 3), generator=gen)
    q = rand_points(2, 4, gen).requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"pcops\.knn: argument 'ref' is an inference tensor"):
        pcops.knn(q, r, 3)
    f = torch.randn(2, 9, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"pcops\.group: argument 'idx' is an inference tensor"):
        pcops.group(f, idx)
    d2, _ = pcops.knn(q, r.clone(), 3)  # a clone made outside inference mode works
    d2.sum().backward()
    assert q.grad is not None
    with torch.no_grad():  # and without autograd, inference tensors are fine
        assert_equal(pcops.group(f, idx), gather_rows(f.detach(), idx), what="group no_grad")


# ---------------------------------------------------------------------------------------------
# devices: every fake (meta) implementation refuses mixed devices as the bindings do; the real
# kernels refuse a meta optional argument


def raw_op_cases(gen):
    """op name -> (positional arguments on the CPU, their names; None for non-tensors)."""
    q, r = rand_points(2, 6, gen), rand_points(2, 9, gen)
    ql, rl = torch.tensor([6, 4]), torch.tensor([9, 3])
    idx = torch.randint(-1, 9, (2, 6, 4), generator=gen)
    f, w = torch.randn(2, 9, 5, generator=gen), torch.rand(2, 6, 4, generator=gen)
    c, s, g = torch.rand(10, 2, generator=gen), torch.rand(10, generator=gen), torch.arange(10) % 3
    knn = ((q, r, 3, ql, rl), ("query", "ref", None, "query_lengths", "ref_lengths"))
    bq = ((q, r, 0.4, 4, ql, rl), ("query", "ref", None, None, "query_lengths", "ref_lengths"))
    fps = ((r, 4, rl, torch.tensor([1, 2])), ("xyz", None, "lengths", "start"))
    nms = ((c, s, 0.3, g), ("centers", "scores", None, "groups"))
    return {
        "knn": knn,
        "_knn_path": (knn[0] + (0,), knn[1] + (None,)),
        "ball_query": bq,
        "_ball_query_path": (bq[0] + (0,), bq[1] + (None,)),
        "ball_query_dist2": bq,
        "furthest_point_sample": fps,
        "_furthest_point_sample_path": (fps[0] + (0,), fps[1] + (None,)),
        "group": ((f, idx), ("features", "idx")),
        "group_backward": ((torch.randn(2, 6, 4, 5), idx, 9), ("grad_out", "idx", None)),
        "interpolate": ((f, idx, w), ("features", "idx", "weight")),
        "neighbor_dist2": ((q, r, idx), ("query", "ref", "idx")),
        "three_nn_pointnet2": ((q, r), ("unknown", "known")),
        "neighbor_edges": ((idx, 9, idx[:, :, 0].clamp(0, 4), ql, rl),
                           ("idx", None, "count", "row_offset", "col_offset")),
        "circle_nms": ((c, s, 0.3, -1, g), ("centers", "scores", None, None, "groups")),
        "circle_nms_mask": nms,
        "_circle_nms_path": (nms[0] + (0,), nms[1] + (None,)),
        "_fps_layout": ((torch.tensor([0, 0, 1, 1, 1]), 0.5, torch.float32), ("batch", None, None)),
    }


OPS = ["knn", "_knn_path", "ball_query", "_ball_query_path", "ball_query_dist2",
       "furthest_point_sample", "_furthest_point_sample_path", "group", "group_backward",
       "interpolate", "neighbor_dist2", "three_nn_pointnet2", "neighbor_edges", "circle_nms",
       "circle_nms_mask", "_circle_nms_path", "_fps_layout"]


def test_the_table_covers_every_op():
    ops = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("pcops::")}
    assert ops - {"_set_debug_checks"} == set(OPS)


@pytest.mark.parametrize("name", OPS)
def test_meta_argument_among_cpu_ones_raises_naming_op_and_argument(gen, name):
    """Each tensor argument in turn on meta, the others on the CPU: the dispatcher picks the
    fake (Meta is the highest backend key), which used to return uninitialised CPU tensors (or
    meta ones for a meta first argument). Now a ValueError naming the op and the argument; and
    the CPU kernel, reached directly, refuses it likewise."""
    args, names = raw_op_cases(gen)[name]
    op = getattr(torch.ops.pcops, name).default
    tensors = [i for i, n in enumerate(names) if n is not None]
    if len(tensors) == 1:
        pytest.skip(f"{name} has one tensor argument")
    for i in tensors:
        mixed = list(args)
        mixed[i] = args[i].to("meta")
        # the argument named is the meta one, or (a meta first argument) the next tensor
        named = names[i] if i != tensors[0] else names[tensors[1]]
        pattern = rf"pcops\.\w+: argument '{named}' must be on the same device as"
        with pytest.raises(ValueError, match=pattern):
            op(*mixed)
        if i != tensors[0]:
            with pytest.raises(ValueError, match=pattern):
                op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *mixed)


@pytest.mark.parametrize("name", [n for n in OPS if n not in ("circle_nms", "neighbor_edges")])
def test_all_meta_arguments_give_meta_outputs_of_the_real_shapes(gen, name):
    args, _ = raw_op_cases(gen)[name]
    op = getattr(torch.ops.pcops, name).default
    real = op(*args)
    fake = op(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args))
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    for a, b in zip(real, fake):
        assert b.device.type == "meta" and b.shape == a.shape and b.dtype == a.dtype


def test_issue_meta_calls_through_the_wrappers(gen):
    q, r = rand_points(2, 5, gen), rand_points(2, 7, gen)
    m = torch.tensor([3, 3]).to("meta")
    idx = torch.randint(0, 7, (2, 5, 3), generator=gen)
    w = torch.rand(2, 5, 3, generator=gen)
    calls = [
        ("knn", "query_lengths", lambda: pcops.knn(q, r, 4, m, None)),
        ("knn", "ref", lambda: pcops.knn(q.to("meta"), r, 4)),
        ("furthest_point_sample", "lengths", lambda: pcops.furthest_point_sample(r, 4, m)),
        ("furthest_point_sample", "start", lambda: pcops.furthest_point_sample(r, 4, None, m)),
        ("ball_query", "ref_lengths", lambda: pcops.ball_query(q, r, 0.3, 4, None, m)),
        ("ball_query_dist2", "query_lengths", lambda: pcops.ball_query_dist2(q, r, 0.3, 4, m)),
        ("group", "idx", lambda: pcops.group(r, idx.to("meta"))),
        ("group_backward", "idx", lambda: pcops.group_backward(torch.rand(2, 5, 3, 4),
                                                               idx.to("meta"), 7)),
        ("circle_nms_mask", "scores", lambda: pcops.circle_nms_mask(
            torch.rand(4, 2), torch.rand(4).to("meta"), 0.5)),
        ("circle_nms_mask", "groups", lambda: pcops.circle_nms_mask(
            torch.rand(4, 2), torch.rand(4), 0.5, torch.zeros(4, dtype=torch.long).to("meta"))),
        ("interpolate", "weight", lambda: pcops.interpolate(r, idx, w.to("meta"))),
        ("knn", "ref_lengths", lambda: pcops.three_nn(q, r, None, m)),
        ("neighbor_dist2", "idx", lambda: pcops.neighbor_dist2(q, r, idx.to("meta"))),
    ]
    for op, arg, call in calls:
        with pytest.raises(ValueError, match=rf"pcops\.{op}: argument '{arg}' must be on the same device"):
            call()


# ---------------------------------------------------------------------------------------------
# FPS's start: checked by the op itself on the CPU


def test_issue_raw_fps_start_equal_to_n_raises():
    """torch.ops.pcops.furthest_point_sample(x, 4, None, tensor([10])) on a 10-point cloud used
    to return start = 0's samples."""
    x = torch.rand(1, 10, 3)
    with pytest.raises(ValueError, match=r"pcops\.furthest_point_sample: argument 'start' must "
                       r"hold, for each b, a value in \[0, lengths\[b\]\).*start\[0\] = 10"):
        torch.ops.pcops.furthest_point_sample(x, 4, None, torch.tensor([10]))
    got = torch.ops.pcops.furthest_point_sample(x, 4, None, torch.tensor([9]))[0]
    assert got[0, 0] == 9


# ---------------------------------------------------------------------------------------------
# messages that name the op and the argument


@pytest.mark.parametrize("op,arg,call", [
    ("knn", "k", lambda q, r, n: pcops.knn(q, r, n)),
    ("knn", "k", lambda q, r, n: pcops.knn(q[0], r[0], n)),
    ("ball_query", "nsample", lambda q, r, n: pcops.ball_query(q, r, 0.2, n)),
    ("ball_query_dist2", "nsample", lambda q, r, n: pcops.ball_query_dist2(q, r, 0.2, n)),
    ("furthest_point_sample", "npoint", lambda q, r, n: pcops.furthest_point_sample(r, n)),
    ("group_backward", "num_points", lambda q, r, n: pcops.group_backward(
        torch.rand(2, 5, 3, 4), torch.zeros(2, 5, 3, dtype=torch.long), n)),
    ("circle_nms", "max_out", lambda q, r, n: pcops.circle_nms(r[0, :, :2], r[0, :, 2], 0.1, n)),
    ("neighbor_edges", "num_ref", lambda q, r, n: pcops.neighbor_edges(
        torch.zeros(2, 5, 3, dtype=torch.long), n)),
])
@pytest.mark.parametrize("value", [2**63, 2**70, -2**64])
def test_integers_beyond_int64_name_op_and_argument(gen, op, arg, call, value):
    q, r = rand_points(2, 5, gen), rand_points(2, 7, gen)
    with pytest.raises(ValueError, match=rf"pcops\.{op}: argument '{arg}' must be an integer in "
                       rf"int64's range \[-2\*\*63, 2\*\*63\), got {value} "):
        call(q, r, value)


def test_float_beyond_float64_names_op_and_argument(gen):
    q = rand_points(2, 5, gen)
    with pytest.raises(ValueError, match=r"pcops\.ball_query: argument 'radius' must be a finite "
                       r"float, got an integer of about 2\*\*2000"):
        pcops.ball_query(q, q, 2**2000, 4)


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "quantized", "nested", "jagged"])
def test_sparse_quantized_nested_tensors_name_op_and_argument(gen, kind):
    q, r = rand_points(2, 5, gen), rand_points(2, 7, gen)
    convert = {
        "sparse_coo": lambda t: t.to_sparse(),
        "sparse_csr": lambda t: t.to_sparse_csr(),
        "quantized": lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.quint8),
        "nested": lambda t: torch.nested.nested_tensor(list(t)),
        "jagged": lambda t: torch.nested.nested_tensor(list(t), layout=torch.jagged),
    }[kind]
    got = "a nested tensor of" if kind in ("nested", "jagged") else f"a {kind} tensor"
    if kind == "sparse_csr":
        c = convert(r[0, :, :2])  # CSR tensors are 2-D
        with pytest.raises(TypeError, match=r"pcops\.circle_nms_mask: argument 'centers' must be a "
                           r"dense \(strided\) tensor, got a sparse_csr tensor"):
            pcops.circle_nms_mask(c, r[0, :, 2], 0.1)
        return
    with pytest.raises(TypeError, match=rf"pcops\.knn: argument 'ref' must be a dense \(strided\) "
                       rf"tensor, got {got}"):
        pcops.knn(q, convert(r), 2)
    with pytest.raises(TypeError, match=rf"pcops\.group: argument 'features' must be a dense "
                       rf"\(strided\) tensor, got {got}"):
        torch.ops.pcops.group.default(convert(r), torch.zeros(2, 5, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"pcops\.neighbor_dist2: argument 'query'"):
        pcops.neighbor_dist2(convert(q), r, torch.zeros(2, 5, 3, dtype=torch.long))


@pytest.mark.parametrize("name,op", [
    ("knn", "knn"), ("three_nn", "knn"), ("ball_query", "ball_query"),
    ("ball_query_dist2", "ball_query_dist2"), ("furthest_point_sample", "furthest_point_sample"),
    ("group", "group"), ("group_backward", "group_backward"), ("interpolate", "interpolate"),
    ("three_interpolate", "interpolate"), ("neighbor_dist2", "neighbor_dist2"),
    ("neighbor_edges", "neighbor_edges"), ("circle_nms", "circle_nms"),
    ("circle_nms_mask", "circle_nms_mask")])
def test_torchscript_says_what_to_use_instead(name, op):
    """TorchScript cannot compile the Python wrappers (keyword-only arguments, *args); scripting
    one, or code that calls one, says to use torch.export / torch.compile or the op itself."""
    message = (rf"pcops\.{name} is a Python function that TorchScript cannot compile .*"
               rf"torch\.export.* torch\.ops\.pcops\.{op}\(")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        with pytest.raises(RuntimeError, match=message):
            torch.jit.script(getattr(pcops, name))


def test_torchscript_of_the_ops_themselves_works(gen):
    def gather_knn(query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        dist2, idx = torch.ops.pcops.knn(query, ref, 4)
        return torch.ops.pcops.group(ref, idx).sum(2) + dist2.sum(-1, keepdim=True)

    def calls_wrapper(query: torch.Tensor) -> torch.Tensor:
        return pcops.group(query, torch.zeros(1, 1, 1, dtype=torch.long))

    q, r = rand_points(2, 10, gen), rand_points(2, 30, gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(gather_knn)
        with pytest.raises(RuntimeError, match=r"pcops\.group is a Python function"):
            torch.jit.script(calls_wrapper)
    assert_equal(scripted(q, r), gather_knn(q, r), what="scripted ops")


_OOM_SCRIPT = textwrap.dedent("""
    import resource, sys, torch, pcops
    def vm_bytes():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))
    limit = vm_bytes() + (1 << 30)  # one more GiB of address space: the allocations below fail
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    x = torch.zeros(1, 1, 3)
    calls = {
        "copy": lambda: pcops.knn(x.expand(512, 1 << 20, 3), x.expand(512, 4, 3), 1),
        "output": lambda: pcops.knn(x.expand(1, 1024, 3), x.expand(1, 4, 3), 1 << 19),
        "features": lambda: pcops.group(torch.zeros(1, 1, 1).expand(256, 1 << 20, 8),
                                        torch.zeros(256, 1, 1, dtype=torch.long)),
        "grad_out": lambda: pcops.group_backward(
            torch.zeros(1, 1, 1, 1).expand(256, 1 << 20, 2, 4),
            torch.zeros(1, 1, 1, dtype=torch.long).expand(256, 1 << 20, 2), 1),
    }
    for name, call in calls.items():
        try:
            call()
            print(name, "NO ERROR")
        except torch.OutOfMemoryError as e:
            print(name, str(e).splitlines()[0])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_allocation_failures_name_op_argument_and_size():
    """Expanded inputs cost no memory until a copy is made; outputs may fit in the device's
    memory and not in what is free. Under an address-space limit (a subprocess, so that no
    allocation can succeed by accident), each failure is torch.OutOfMemoryError naming the op,
    the argument, the shape and the bytes (it used to be the allocator's message alone)."""
    out = subprocess.run([sys.executable, "-c", _OOM_SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["copy"].startswith(
        "pcops.knn: out of memory: cannot allocate a contiguous Float copy of argument 'query' "
        "([512, 1048576, 3], Float, 6 GiB) on cpu ("), lines["copy"]
    assert lines["output"].startswith(
        "pcops.knn: out of memory: cannot allocate a tensor for argument 'k' ([1, 1024, 524288], "
        "Float, 2 GiB) on cpu ("), lines["output"]
    assert lines["features"].startswith(
        "pcops.group: out of memory: cannot allocate a contiguous Float copy of argument "
        "'features' ([256, 1048576, 8], Float, 8 GiB)"), lines["features"]
    assert lines["grad_out"].startswith(
        "pcops.group_backward: out of memory: cannot allocate a contiguous Float copy of argument "
        "'grad_out' ([256, 1048576, 2, 4], Float, 8 GiB)"), lines["grad_out"]
