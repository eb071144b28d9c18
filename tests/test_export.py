"""torch.export of the public wrappers and of pcops.preprocess: the exported program holds the
pcops ops (traced through their fake impls) and returns eager's bits. The AOTInductor run of
the exported programs from C++ (examples/aoti) is CI's step of its own (.ci/run)."""
import pytest
import torch

import pcops
from helpers import assert_equal


def rand_points(B, N, gen):
    return torch.rand(B, N, 3, generator=gen)


class Wrappers(torch.nn.Module):
    """One call of each wrapper that torch.export can trace (fixed output sizes)."""

    def forward(self, query, ref, features, lengths):
        idx = pcops.furthest_point_sample(ref, 8, lengths)
        dist2, knn_idx = pcops.knn(query, ref, 4, ref_lengths=lengths)
        bq = pcops.ball_query(query, ref, 0.3, 6, ref_lengths=lengths)
        bq_d, bq_i = pcops.ball_query_dist2(query, ref, 0.3, 6)
        grouped = pcops.group(features, knn_idx)
        nn_d, nn_i = pcops.three_nn(query, ref)
        w = 1.0 / (nn_d + 1e-8)
        interp = pcops.interpolate(features, nn_i, w / w.sum(-1, keepdim=True))
        nd = pcops.neighbor_dist2(query, ref, bq)
        keep = pcops.circle_nms_mask(ref[0, :, :2], ref[0, :, 2], 0.2)
        return idx, dist2, knn_idx, bq, bq_d, bq_i, grouped, nn_d, nn_i, interp, nd, keep


def test_export_of_the_wrappers_matches_eager(gen):
    query, ref = rand_points(2, 10, gen), rand_points(2, 40, gen)
    features = torch.rand(2, 40, 5, generator=gen)
    lengths = torch.tensor([40, 25])
    inputs = (query, ref, features, lengths)
    eager = Wrappers()(*inputs)
    exported = torch.export.export(Wrappers(), inputs)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    for op in ("furthest_point_sample", "knn", "ball_query", "group", "interpolate",
               "neighbor_dist2", "circle_nms_mask"):
        assert any(t.startswith(f"pcops.{op}.") for t in targets), (op, sorted(targets))
    got = exported.module()(*inputs)
    for i, (e, g) in enumerate(zip(eager, got)):
        assert_equal(g, e, what=f"exported output {i}")


class Preprocess(torch.nn.Module):
    def forward(self, xyz, lengths):
        return tuple(pcops.preprocess(xyz, 16, 4, lengths=lengths))


@pytest.mark.parametrize("radius", [None, 0.25])
def test_export_of_preprocess_matches_eager(gen, radius):
    module = Preprocess()
    if radius is not None:
        module.forward = lambda xyz, lengths: tuple(
            pcops.preprocess(xyz, 16, 4, lengths=lengths, radius=radius))
    xyz, lengths = rand_points(2, 60, gen), torch.tensor([60, 33])
    eager = module(xyz, lengths)
    got = torch.export.export(module, (xyz, lengths)).module()(xyz, lengths)
    assert len(got) == len(eager)
    for i, (e, g) in enumerate(zip(eager, got)):
        assert_equal(g, e, what=f"exported preprocess output {i}")


def test_export_with_a_dynamic_number_of_points(gen):
    """The ops' fakes take symbolic sizes: one export serves clouds of any size."""
    n = torch.export.Dim("n", min=8, max=4096)
    exported = torch.export.export(Preprocess(), (rand_points(2, 60, gen), torch.tensor([60, 33])),
                                   dynamic_shapes=({1: n}, None))
    xyz, lengths = rand_points(2, 200, gen), torch.tensor([200, 150])
    for e, g in zip(Preprocess()(xyz, lengths), exported.module()(xyz, lengths)):
        assert_equal(g, e, what="exported preprocess, another size")


class KnnMetric(torch.nn.Module):
    def forward(self, query, ref):
        return pcops.knn(query, ref, 5, metric="cosine")


def test_export_of_knn_of_any_dimension_with_a_metric(gen):
    """knn's str argument (metric) and points of D != 3 survive export and reach the binding."""
    query, ref = torch.rand(2, 12, 16, generator=gen), torch.rand(2, 50, 16, generator=gen)
    exported = torch.export.export(KnnMetric(), (query, ref))
    calls = [n for n in exported.graph.nodes if str(n.target).startswith("pcops.knn.")]
    assert calls and "cosine" in [*calls[0].args, *calls[0].kwargs.values()], calls
    for i, (e, g) in enumerate(zip(KnnMetric()(query, ref), exported.module()(query, ref))):
        assert_equal(g, e, what=f"exported knn output {i}")
