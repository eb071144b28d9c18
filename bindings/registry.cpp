// registry.cpp -- the whole public op API of pcops in one place: one schema per op.
//
// The implementations are registered per backend in bindings/<op>.cpp with
// STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) and STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m); fake
// (meta) implementations, autograd formulas and the Autograd fallthroughs of the ops without a
// gradient are registered from Python, in pcops/<op>.py and pcops/_loader.py. The extension
// module itself (PyInit__C) is bindings/module.cpp.
// Shapes: B batch, N reference points, M queries / samples, C channels, K / S neighbours.
#include "utils.h"

STABLE_TORCH_LIBRARY(pcops, m) {
    // xyz[B,N,D] (any D >= 1; D = 3 has its own paths) -> idx[B,npoint] int64,
    // dist2[B,npoint] (xyz's dtype). Greedy FPS from
    // start[b] (default 0), which must lie in [0, lengths[b]): checked on the CPU (on CUDA in
    // debug mode; unchecked, it is taken mod lengths[b]); pcops.furthest_point_sample draws
    // random_start=True on the device. dist2[b,j] is the coverage radius (squared) when sample j
    // was chosen, 0 for sample 0. Slots past min(npoint, lengths[b]) hold idx -1 and dist2 0.
    m.def(
        "furthest_point_sample(Tensor xyz, int npoint, Tensor? lengths=None, Tensor? start=None) "
        "-> (Tensor idx, Tensor dist2)");

    // query[B,M,D], ref[B,N,D] (any D >= 1) -> dist2[B,M,k] (query's dtype), idx[B,M,k] int64:
    // the k nearest valid refs sorted by (dist2, idx); idx -1 / dist2 +inf past the valid refs.
    // metric: "l2" (squared L2), "l1" or "cosine" (1 - cos); dist2 then holds that distance.
    m.def(
        "knn(Tensor query, Tensor ref, int k, Tensor? query_lengths=None, "
        "Tensor? ref_lengths=None, str metric=\"l2\") -> (Tensor dist2, Tensor idx)");

    // query[B,M,D], ref[B,N,D] (any D >= 1; D = 3 has its own paths) -> idx[B,M,nsample]
    // int64, count[B,M] int64: the first nsample valid refs in index order with squared
    // distance < radius**2; empty slots repeat the first one found; -1 if none.
    m.def(
        "ball_query(Tensor query, Tensor ref, float radius, int nsample, "
        "Tensor? query_lengths=None, Tensor? ref_lengths=None) -> (Tensor idx, Tensor count)");

    // -> dist2[B,M,nsample] (query's dtype), idx[B,M,nsample] int64 (knn's order): ball_query's
    // neighbours
    // in PyTorch3D's layout: empty slots hold idx -1 and dist2 0 (ball_query repeats the first
    // neighbour); dist2 with the searches' arithmetic (neighbor_dist2's bits), differentiable
    // w.r.t. query and ref.
    m.def(
        "ball_query_dist2(Tensor query, Tensor ref, float radius, int nsample, "
        "Tensor? query_lengths=None, Tensor? ref_lengths=None) -> (Tensor dist2, Tensor idx)");

    // features[B,N,C], idx[B,M,S] -> out[B,M,S,C] = features[b, idx[b,m,s], :] (0 where idx is -1).
    m.def("group(Tensor features, Tensor idx) -> Tensor");

    // grad_out[B,M,S,C], idx[B,M,S] -> grad_features[B,num_points,C]: the deterministic backward
    // of group (a fixed summation order, no floating-point atomics).
    m.def("group_backward(Tensor grad_out, Tensor idx, SymInt num_points) -> Tensor");

    // centers[N,2|3], scores[N] -> keep[K] int64: greedy circle NMS in descending score order
    // (ties: lower index first), kept indices in visiting order, at most max_out when > 0;
    // groups[N] makes the NMS independent per group. Synchronises (K depends on the data).
    m.def(
        "circle_nms(Tensor centers, Tensor scores, float radius, int max_out=-1, "
        "Tensor? groups=None) -> Tensor");

    // -> keep_mask[N] bool: the same NMS, without host synchronisation (CUDA-graph capturable).
    m.def(
        "circle_nms_mask(Tensor centers, Tensor scores, float radius, Tensor? groups=None) "
        "-> Tensor");

    // features[B,N,C], idx[B,M,K] int64/int32, weight[B,M,K] -> out[B,M,C]: the weighted sum of the K
    // gathered feature rows (PointNet++ feature propagation; K = 3 for three_interpolate),
    // added in ascending k; idx -1 adds nothing. Backward composed from group/group_backward.
    m.def("interpolate(Tensor features, Tensor idx, Tensor weight) -> Tensor");

    // query[B,M,3], ref[B,N,3], idx[B,M,S] int64/int32 -> dist2[B,M,S] (query's dtype):
    // |query[b,m] - ref[b, idx[b,m,s]]|^2 with the searches' arithmetic (the bits of knn's
    // dist2), 0 where idx is outside [0, N). Backward composed from group/group_backward.
    m.def("neighbor_dist2(Tensor query, Tensor ref, Tensor idx) -> Tensor");

    // unknown[B,n,3], known[B,m,3] -> dist[B,n,3] (unknown's dtype), idx[B,n,3] int32:
    // pointnet2_ops's three_nn in one op, the kNN with k = 3 in its layout: dist = sqrt of
    // knn's dist2 (correctly rounded, the same bits on CPU and CUDA), slots past m (m < 3)
    // hold idx 0 and dist +inf. Not differentiable (the Autograd key falls through).
    m.def("three_nn_pointnet2(Tensor unknown, Tensor known) -> (Tensor dist, Tensor idx)");

    // idx[B,M,S] int64, count[B,M]? -> edges[2,E] int64: the COO edges of neighbour lists, one
    // per slot with 0 <= idx < num_ref (and s < count[b,m] when count is given), in (b,m,s)
    // order; row = row_offset[b] + m (default b*M + m), col = col_offset[b] + idx (default
    // b*num_ref + idx). Synchronises (E depends on the data).
    m.def(
        "neighbor_edges(Tensor idx, int num_ref, Tensor? count=None, Tensor? row_offset=None, "
        "Tensor? col_offset=None) -> Tensor");

    // Internal (pcops.compat.torch_cluster.fps): batch[N] int64, a sorted batch vector ->
    // stats[6] int64 (problems: steps down + a negative first id, first id, last id, largest
    // cloud L, samples E, K = samples of L), left[N] (each point's cloud's first point),
    // slot[N] (b*K + rank for the sampled points, else -1); a cloud of n points takes
    // ceil(n * ratio) samples rounded in `dtype` as torch_cluster does, none when
    // 0 <= batch_size <= its id. No synchronisation (the caller reads stats once).
    m.def(
        "_fps_layout(Tensor batch, float ratio, ScalarType dtype, int batch_size=-1) "
        "-> (Tensor stats, Tensor left, Tensor slot)");

    // Private (tests, benchmarks): each op with several paths, forced through one of them.
    // `path` is an id of the op's table (kernels/<op>_paths.h; pcops/_paths.py has the names);
    // 0 is AUTO. A path that does not run on the device or dtype, or cannot take the inputs,
    // raises a ValueError: a forced path never falls back. Every path returns the same bits.
    m.def(
        "_furthest_point_sample_path(Tensor xyz, int npoint, Tensor? lengths, Tensor? start, "
        "int path) -> (Tensor idx, Tensor dist2)");
    m.def(
        "_knn_path(Tensor query, Tensor ref, int k, Tensor? query_lengths, "
        "Tensor? ref_lengths, int path) -> (Tensor dist2, Tensor idx)");
    m.def(
        "_ball_query_path(Tensor query, Tensor ref, float radius, int nsample, "
        "Tensor? query_lengths, Tensor? ref_lengths, int path) -> (Tensor idx, Tensor count)");
    // circle NMS -> keep_mask[N] bool, keep_idx[N] int64 (-1 past num_kept), num_kept[1] int64.
    m.def(
        "_circle_nms_path(Tensor centers, Tensor scores, float radius, Tensor? groups, "
        "int path) -> (Tensor keep_mask, Tensor keep_idx, Tensor num_kept)");

    // Debug mode of the value checks of index inputs on CUDA (bindings/utils.h): enabled, the
    // bindings check idx / lengths / start values on CUDA too, at one host sync per check.
    // Returns the previous setting. pcops.set_debug_checks wraps it.
    m.def("_set_debug_checks(bool enabled) -> bool");
}

// An op without tensor arguments dispatches to its CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(pcops, CompositeExplicitAutograd, m) {
    m.impl("_set_debug_checks", TORCH_BOX(&pcops::set_debug_checks));
}
