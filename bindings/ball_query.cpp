// ball_query.cpp -- bindings of ball_query and ball_query_dist2 (the same search in PyTorch3D's
// layout, with distances): checks, allocation, dispatch to kernels/ball_query.* (and, for
// ball_query_dist2, kernels/neighbor_dist2.*) for D = 3, to kernels/ball_query_nd.* (both
// layouts) for any other D >= 1.
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "ball_query";
constexpr const char* kOpDist2 = "ball_query_dist2";

constexpr const char* kPathOp = "_ball_query_path";

std::string sizes_of(int64_t B, int64_t M, int64_t N, int64_t nsample) {
    return "B = " + std::to_string(B) + ", M = " + std::to_string(M) + ", N = " +
           std::to_string(N) + ", nsample = " + std::to_string(nsample);
}

// Checked, contiguous inputs and allocated outputs, shared by the CPU and CUDA paths.
struct BallQueryCall {
    // [B,M,D], float32 or float64 (half types upcast), contiguous
    Tensor query = undefined_tensor();
    Tensor ref = undefined_tensor();  // [B,N,D], same D and dtype as query
    std::optional<Tensor> query_lengths;
    std::optional<Tensor> ref_lengths;
    Tensor idx = undefined_tensor();  // [B,M,nsample] int64
    Tensor count = undefined_tensor();  // [B,M] int64
    double radius2;    // radius**2 in double; the kernels compare d < (T)radius2
    int64_t B, M, N, D, nsample;
};

BallQueryCall prepare(const Tensor& query, const Tensor& ref, double radius, int64_t nsample,
                      const std::optional<Tensor>& query_lengths,
                      const std::optional<Tensor>& ref_lengths, const char* op = kOp) {
    QueryRef q = check_query_ref(op, query, ref, query_lengths, ref_lengths, "query", "ref",
                                 /*any_dim=*/true);
    check_radius(op, "radius", radius);
    check_positive(op, "nsample", nsample);
    check_output_elements(op, "nsample", {q.B, q.M, nsample}, 8, query);
    BallQueryCall c;
    c.B = q.B;
    c.M = q.M;
    c.N = q.N;
    c.D = q.query.size(2);
    c.nsample = nsample;
    c.radius2 = radius * radius;
    c.query_lengths = q.query_lengths;
    c.ref_lengths = q.ref_lengths;
    c.query = q.query;
    c.ref = q.ref;
    c.idx = allocate(op, "nsample", {c.B, c.M, nsample}, ScalarType::Long, query);
    c.count = allocate(op, "query", {c.B, c.M}, ScalarType::Long, query);
    return c;
}

// Points of D != 3 coordinates take the kernels of any dimension (kernels/ball_query_nd.c,
// ball_query_nd.cu): one path, the brute force. A forced path other than AUTO / BRUTE cannot
// take them. D = 3 keeps the paths of the table (kernels/ball_query_paths.h).
void check_nd_path(const char* forced, int64_t path, const BallQueryCall& c) {
    if (forced != nullptr && path != PCOPS_BALL_QUERY_BRUTE)
        forced_path_refused(kPathOp, forced,
                            sizes_of(c.B, c.M, c.N, c.nsample) + ", D = " + std::to_string(c.D) +
                                " (points of D != 3 take the brute force only)");
}

std::tuple<Tensor, Tensor> ball_query_cpu(const Tensor& query, const Tensor& ref, double radius,
                                          int64_t nsample,
                                          const std::optional<Tensor>& query_lengths,
                                          const std::optional<Tensor>& ref_lengths, int64_t path) {
    BallQueryCall c = prepare(query, ref, radius, nsample, query_lengths, ref_lengths);
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    const char* forced = path == PCOPS_BALL_QUERY_AUTO
                             ? nullptr
                             : check_path(kPathOp, "ball_query", path, false, dtype);
    if (c.D != 3) {
        check_nd_path(forced, path, c);
        check_status(kOp, pcops_ball_query_nd_cpu(
                              dtype, c.query.data_ptr(), c.ref.data_ptr(),
                              ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths), c.B, c.M,
                              c.N, c.D, c.radius2, c.nsample, data<int64_t>(c.idx),
                              data<int64_t>(c.count), nullptr));
        return {c.idx, c.count};
    }
    const pcops_ball_query_path v = (pcops_ball_query_path)path;
    Tensor workspace = allocate(kOp, nullptr,
                                    {(int64_t)pcops_ball_query_cpu_workspace_bytes(
                                        dtype, c.B, c.M, c.N, c.radius2, c.nsample, v)},
                                    ScalarType::Byte, c.query);
    const pcops_status status = pcops_ball_query_cpu_path(
        dtype, c.query.data_ptr(), c.ref.data_ptr(), ptr_or_null(c.query_lengths),
        ptr_or_null(c.ref_lengths), c.B, c.M, c.N, c.radius2, c.nsample, v,
        workspace_ptr(workspace), data<int64_t>(c.idx), data<int64_t>(c.count));
    if (status != PCOPS_SUCCESS && forced != nullptr)
        forced_path_refused(kPathOp, forced, sizes_of(c.B, c.M, c.N, c.nsample));
    check_status(kOp, status);
    return {c.idx, c.count};
}

std::tuple<Tensor, Tensor> ball_query_cpu_auto(const Tensor& query, const Tensor& ref,
                                               double radius, int64_t nsample,
                                               const std::optional<Tensor>& query_lengths,
                                               const std::optional<Tensor>& ref_lengths) {
    return ball_query_cpu(query, ref, radius, nsample, query_lengths, ref_lengths,
                          PCOPS_BALL_QUERY_AUTO);
}

// ball_query_dist2: the ball query above (auto path), then one pass that empties the padded
// slots (idx -1, dist2 0: PyTorch3D's layout) and writes the others' squared distances with the
// searches' arithmetic. dist2 in the dtype of query.
Tensor dist2_in_query_dtype(const Tensor& dist2, const Tensor& query) {
    return to_dist_dtype(kOpDist2, "nsample", dist2, dtype_of(query));
}

std::tuple<Tensor, Tensor> ball_query_dist2_cpu(const Tensor& query, const Tensor& ref,
                                                double radius, int64_t nsample,
                                                const std::optional<Tensor>& query_lengths,
                                                const std::optional<Tensor>& ref_lengths) {
    BallQueryCall c =
        prepare(query, ref, radius, nsample, query_lengths, ref_lengths, kOpDist2);
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    if (c.D != 3) {  // one pass writes both outputs in this layout
        Tensor dist2 = allocate(kOpDist2, "nsample", c.idx.sizes(), dtype_of(c.query), c.query);
        check_status(kOpDist2, pcops_ball_query_nd_cpu(
                                   dtype, c.query.data_ptr(), c.ref.data_ptr(),
                                   ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths),
                                   c.B, c.M, c.N, c.D, c.radius2, c.nsample,
                                   data<int64_t>(c.idx), data<int64_t>(c.count),
                                   dist2.data_ptr()));
        return {dist2_in_query_dtype(dist2, query), c.idx};
    }
    Tensor workspace = allocate(
        kOpDist2, nullptr,
        {(int64_t)pcops_ball_query_cpu_workspace_bytes(dtype, c.B, c.M, c.N, c.radius2,
                                                       c.nsample, PCOPS_BALL_QUERY_AUTO)},
        ScalarType::Byte, c.query);
    check_status(kOpDist2, pcops_ball_query_cpu_path(
                               dtype, c.query.data_ptr(), c.ref.data_ptr(),
                               ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths), c.B,
                               c.M, c.N, c.radius2, c.nsample, PCOPS_BALL_QUERY_AUTO,
                               workspace.data_ptr(), data<int64_t>(c.idx),
                               data<int64_t>(c.count)));
    Tensor dist2 = allocate(kOpDist2, "nsample", c.idx.sizes(), dtype_of(c.query), c.query);
    check_status(kOpDist2, pcops_neighbor_dist2_count_cpu(
                               dtype, c.query.data_ptr(), c.ref.data_ptr(), data<int64_t>(c.idx),
                               data<int64_t>(c.count), c.B, c.M, c.N, c.nsample, dist2.data_ptr()));
    return {dist2_in_query_dtype(dist2, query), c.idx};
}

#ifdef PCOPS_WITH_CUDA
std::tuple<Tensor, Tensor> ball_query_cuda(const Tensor& query, const Tensor& ref, double radius,
                                           int64_t nsample,
                                           const std::optional<Tensor>& query_lengths,
                                           const std::optional<Tensor>& ref_lengths, int64_t path) {
    check_cuda_tensor(kOp, "query", query);
    DeviceGuard guard(query);
    BallQueryCall c = prepare(query, ref, radius, nsample, query_lengths, ref_lengths);
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    const char* forced = path == PCOPS_BALL_QUERY_AUTO
                             ? nullptr
                             : check_path(kPathOp, "ball_query", path, true, dtype);
    if (c.D != 3) {
        check_nd_path(forced, path, c);
        check_cuda(kOp, pcops_ball_query_nd_cuda(
                            dtype, c.query.data_ptr(), c.ref.data_ptr(),
                            ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths), c.B, c.M,
                            c.N, c.D, c.radius2, c.nsample, data<int64_t>(c.idx),
                            data<int64_t>(c.count), nullptr, current_stream(query)));
        return {c.idx, c.count};
    }
    pcops_ball_query_cuda_plan plan;
    const cudaError_t err = pcops_ball_query_cuda_plan_make(
        dtype, c.B, c.M, c.N, c.radius2, c.nsample, (pcops_ball_query_path)path, &plan);
    if (err != cudaSuccess && forced != nullptr)
        forced_path_refused(kPathOp, forced, sizes_of(c.B, c.M, c.N, c.nsample));
    check_cuda(kOp, err);
    Tensor workspace = workspace_tensor(kOp, plan.workspace_bytes, c.query);
    check_cuda(kOp, pcops_ball_query_cuda_run(&plan, c.query.data_ptr(), c.ref.data_ptr(),
                                              ptr_or_null(c.query_lengths),
                                              ptr_or_null(c.ref_lengths), workspace_ptr(workspace),
                                              data<int64_t>(c.idx),
                                              data<int64_t>(c.count),
                                              current_stream(query)));
    return {c.idx, c.count};
}

std::tuple<Tensor, Tensor> ball_query_cuda_auto(const Tensor& query, const Tensor& ref,
                                                double radius, int64_t nsample,
                                                const std::optional<Tensor>& query_lengths,
                                                const std::optional<Tensor>& ref_lengths) {
    return ball_query_cuda(query, ref, radius, nsample, query_lengths, ref_lengths,
                           PCOPS_BALL_QUERY_AUTO);
}

std::tuple<Tensor, Tensor> ball_query_dist2_cuda(const Tensor& query, const Tensor& ref,
                                                 double radius, int64_t nsample,
                                                 const std::optional<Tensor>& query_lengths,
                                                 const std::optional<Tensor>& ref_lengths) {
    check_cuda_tensor(kOpDist2, "query", query);
    DeviceGuard guard(query);
    BallQueryCall c =
        prepare(query, ref, radius, nsample, query_lengths, ref_lengths, kOpDist2);
    pcops_ball_query_cuda_plan plan;
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    if (c.D != 3) {  // one pass writes both outputs in this layout
        Tensor dist2 = allocate(kOpDist2, "nsample", c.idx.sizes(), dtype_of(c.query), c.query);
        check_cuda(kOpDist2, pcops_ball_query_nd_cuda(
                                 dtype, c.query.data_ptr(), c.ref.data_ptr(),
                                 ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths), c.B,
                                 c.M, c.N, c.D, c.radius2, c.nsample, data<int64_t>(c.idx),
                                 data<int64_t>(c.count), dist2.data_ptr(),
                                 current_stream(query)));
        return {dist2_in_query_dtype(dist2, query), c.idx};
    }
    check_cuda(kOpDist2, pcops_ball_query_cuda_plan_make(dtype, c.B, c.M, c.N, c.radius2,
                                                         c.nsample, PCOPS_BALL_QUERY_AUTO, &plan));
    Tensor workspace = workspace_tensor(kOpDist2, plan.workspace_bytes, c.query);
    cudaStream_t stream = current_stream(query);
    check_cuda(kOpDist2, pcops_ball_query_cuda_run(&plan, c.query.data_ptr(), c.ref.data_ptr(),
                                                   ptr_or_null(c.query_lengths),
                                                   ptr_or_null(c.ref_lengths),
                                                   workspace_ptr(workspace), data<int64_t>(c.idx),
                                                   data<int64_t>(c.count), stream));
    Tensor dist2 = allocate(kOpDist2, "nsample", c.idx.sizes(), dtype_of(c.query), c.query);
    check_cuda(kOpDist2, pcops_neighbor_dist2_count_cuda(
                             dtype, c.query.data_ptr(), c.ref.data_ptr(),
                             data<int64_t>(c.idx), data<int64_t>(c.count), c.B, c.M,
                             c.N, c.nsample, dist2.data_ptr(), stream));
    return {dist2_in_query_dtype(dist2, query), c.idx};
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("ball_query", TORCH_BOX(&pcops::ball_query_cpu_auto));
    m.impl("_ball_query_path", TORCH_BOX(&pcops::ball_query_cpu));
    m.impl("ball_query_dist2", TORCH_BOX(&pcops::ball_query_dist2_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("ball_query", TORCH_BOX(&pcops::ball_query_cuda_auto));
    m.impl("_ball_query_path", TORCH_BOX(&pcops::ball_query_cuda));
    m.impl("ball_query_dist2", TORCH_BOX(&pcops::ball_query_dist2_cuda));
}
#endif

// Autograd: ball_query's outputs are indices and counts, not differentiable; its Autograd key
// falls through (registered in pcops/_loader.py), which keeps the call in C++ (no autograd
// fallback kernel: inputs that require grad are accepted and the outputs do not require it).
// ball_query_dist2's distances have their backward in Python (pcops/ball_query.py).
