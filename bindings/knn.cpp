// knn.cpp -- binding of knn: checks, allocation, dispatch to kernels/knn.*.
#include <climits>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "knn";

constexpr const char* kPathOp = "_knn_path";

std::string sizes_of(int64_t B, int64_t M, int64_t N, int64_t k) {
    return "B = " + std::to_string(B) + ", M = " + std::to_string(M) + ", N = " +
           std::to_string(N) + ", k = " + std::to_string(k);
}

// The metric named by the schema's string argument.
pcops_knn_metric metric_of(const std::string& metric) {
    if (metric == "l2") return PCOPS_KNN_L2;
    if (metric == "l1") return PCOPS_KNN_L1;
    if (metric == "cosine") return PCOPS_KNN_COSINE;
    PCOPS_CHECK_VALUE(false, "pcops.", kOp,
                      ": argument 'metric' must be 'l2', 'l1' or 'cosine', got '", metric, "'");
    return PCOPS_KNN_L2;
}

// Points of D != 3 coordinates, and the metrics other than L2, take the kernels of any
// dimension (kernels/knn_nd.c, knn_nd.cu): the brute force, on the CPU its blocked path
// (float32 L2), on CUDA the tensor-core shortlist "tc" (L2, float32, 16 <= D <= 65536, k <= 64,
// sm_80+). The 3-D L2 search keeps its paths. Another forced path cannot take such inputs.
void nd_path_refused(const char* forced, int64_t B, int64_t M, int64_t N, int64_t k, int64_t D) {
    forced_path_refused(kPathOp, forced,
                        sizes_of(B, M, N, k) + ", D = " + std::to_string(D) +
                            " (points of D != 3, or a metric other than l2, take the brute "
                            "force, or on the CPU its blocked path for float32 l2, or on CUDA "
                            "'tc': l2, float32, 16 <= D <= 65536, k <= 64, sm_80+)");
}

// Checked, contiguous inputs and allocated outputs, shared by the CPU and CUDA paths.
struct KnnCall {
    // [B,M,D], float32 or float64 (half types upcast), contiguous
    Tensor query = undefined_tensor();
    Tensor ref = undefined_tensor();  // [B,N,D], same dtype as query, contiguous
    std::optional<Tensor> query_lengths;
    std::optional<Tensor> ref_lengths;
    Tensor dist2 = undefined_tensor();  // [B,M,k], in the compute dtype
    Tensor idx = undefined_tensor();  // [B,M,k] int64
    int64_t B, M, N, D, k;
    pcops_knn_metric metric;
    bool nd;  // D != 3 or a metric other than L2: the kernels of any dimension
};

KnnCall prepare(const Tensor& query, const Tensor& ref, int64_t k,
                const std::optional<Tensor>& query_lengths,
                const std::optional<Tensor>& ref_lengths, const std::string& metric) {
    QueryRef q = check_query_ref(kOp, query, ref, query_lengths, ref_lengths, "query", "ref",
                                 /*any_dim=*/true);
    check_positive(kOp, "k", k);
    check_output_elements(kOp, "k", {q.B, q.M, k}, q.query.element_size() + 8, query);
    KnnCall c;
    c.B = q.B;
    c.M = q.M;
    c.N = q.N;
    c.D = q.query.size(2);
    c.k = k;
    c.metric = metric_of(metric);
    c.nd = c.D != 3 || c.metric != PCOPS_KNN_L2;
    c.query_lengths = q.query_lengths;
    c.ref_lengths = q.ref_lengths;
    c.query = q.query;
    c.ref = q.ref;
    c.dist2 = allocate(kOp, "k", {c.B, c.M, k}, dtype_of(c.query), c.query);
    c.idx = allocate(kOp, "k", {c.B, c.M, k}, ScalarType::Long, query);
    return c;
}

std::tuple<Tensor, Tensor> knn_cpu_metric(const Tensor& query, const Tensor& ref, int64_t k,
                                          const std::optional<Tensor>& query_lengths,
                                          const std::optional<Tensor>& ref_lengths, int64_t path,
                                          const std::string& metric) {
    KnnCall c = prepare(query, ref, k, query_lengths, ref_lengths, metric);
    pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    const char* forced =
        path == PCOPS_KNN_AUTO ? nullptr : check_path(kPathOp, "knn", path, false, dtype);
    if (c.nd) {
        const pcops_status status = pcops_knn_nd_cpu(
            dtype, c.query.data_ptr(), c.ref.data_ptr(), ptr_or_null(c.query_lengths),
            ptr_or_null(c.ref_lengths), c.B, c.M, c.N, c.D, c.k, c.metric, (pcops_knn_path)path,
            c.dist2.data_ptr(), data<int64_t>(c.idx));
        if (status != PCOPS_SUCCESS && forced != nullptr)
            nd_path_refused(forced, c.B, c.M, c.N, c.k, c.D);
        check_status(kOp, status);
        return {to_dist_dtype(kOp, "k", c.dist2, dtype_of(query)), c.idx};
    }
    const pcops_knn_path v = (pcops_knn_path)path;
    const int64_t workspace_bytes =
        (int64_t)pcops_knn_cpu_workspace_bytes(dtype, c.B, c.M, c.N, c.k, v);
    Tensor workspace =
        allocate(kOp, nullptr, {workspace_bytes}, ScalarType::Byte, c.query);
    const pcops_status status = pcops_knn_cpu_path(
        dtype, c.query.data_ptr(), c.ref.data_ptr(), ptr_or_null(c.query_lengths),
        ptr_or_null(c.ref_lengths), c.B, c.M, c.N, c.k, v, workspace_ptr(workspace),
        c.dist2.data_ptr(), data<int64_t>(c.idx));
    if (status != PCOPS_SUCCESS && forced != nullptr)
        forced_path_refused(kPathOp, forced, sizes_of(c.B, c.M, c.N, c.k));
    check_status(kOp, status);
    return {to_dist_dtype(kOp, "k", c.dist2, dtype_of(query)), c.idx};
}

std::tuple<Tensor, Tensor> knn_cpu(const Tensor& query, const Tensor& ref, int64_t k,
                                   const std::optional<Tensor>& query_lengths,
                                   const std::optional<Tensor>& ref_lengths, int64_t path) {
    return knn_cpu_metric(query, ref, k, query_lengths, ref_lengths, path, "l2");
}

std::tuple<Tensor, Tensor> knn_cpu_auto(const Tensor& query, const Tensor& ref, int64_t k,
                                        const std::optional<Tensor>& query_lengths,
                                        const std::optional<Tensor>& ref_lengths,
                                        const std::string& metric) {
    return knn_cpu_metric(query, ref, k, query_lengths, ref_lengths, PCOPS_KNN_AUTO, metric);
}

#ifdef PCOPS_WITH_CUDA
std::tuple<Tensor, Tensor> knn_cuda_metric(const Tensor& query, const Tensor& ref, int64_t k,
                                           const std::optional<Tensor>& query_lengths,
                                           const std::optional<Tensor>& ref_lengths,
                                           int64_t path, const std::string& metric) {
    check_cuda_tensor(kOp, "query", query);
    DeviceGuard guard(query);
    KnnCall c = prepare(query, ref, k, query_lengths, ref_lengths, metric);
    // Indices inside a cloud are 32-bit on the GPU.
    PCOPS_CHECK_VALUE(c.M <= INT_MAX && c.N <= INT_MAX && c.k <= INT_MAX, "pcops.", kOp,
                      ": on CUDA, M, N and k must be at most 2**31 - 1, got M = ", c.M,
                      ", N = ", c.N, ", k = ", c.k);
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.query));
    const char* forced =
        path == PCOPS_KNN_AUTO ? nullptr : check_path(kPathOp, "knn", path, true, dtype);
    if (c.nd) {
        pcops_knn_nd_cuda_plan plan;
        const cudaError_t err = pcops_knn_nd_cuda_plan_make(
            dtype, c.B, c.M, c.N, c.D, c.k, c.metric, (pcops_knn_path)path, &plan);
        if (err != cudaSuccess && forced != nullptr)
            nd_path_refused(forced, c.B, c.M, c.N, c.k, c.D);
        check_cuda(kOp, err);
        Tensor workspace = workspace_tensor(kOp, plan.workspace_bytes, c.query);
        check_cuda(kOp, pcops_knn_nd_cuda_run(&plan, c.query.data_ptr(), c.ref.data_ptr(),
                                              ptr_or_null(c.query_lengths),
                                              ptr_or_null(c.ref_lengths),
                                              workspace_ptr(workspace), c.dist2.data_ptr(),
                                              data<int64_t>(c.idx), current_stream(query)));
        return {to_dist_dtype(kOp, "k", c.dist2, dtype_of(query)), c.idx};
    }
    pcops_knn_cuda_plan plan;
    const cudaError_t err =
        pcops_knn_cuda_plan_make(dtype, c.B, c.M, c.N, c.k, (pcops_knn_path)path, &plan);
    if (err != cudaSuccess && forced != nullptr)
        forced_path_refused(kPathOp, forced, sizes_of(c.B, c.M, c.N, c.k));
    check_cuda(kOp, err);
    Tensor workspace = workspace_tensor(kOp, plan.workspace_bytes, c.query);
    check_cuda(kOp, pcops_knn_cuda_run(&plan, c.query.data_ptr(), c.ref.data_ptr(),
                                       ptr_or_null(c.query_lengths), ptr_or_null(c.ref_lengths),
                                       workspace_ptr(workspace), c.dist2.data_ptr(),
                                       data<int64_t>(c.idx),
                                       current_stream(query)));
    return {to_dist_dtype(kOp, "k", c.dist2, dtype_of(query)), c.idx};
}

std::tuple<Tensor, Tensor> knn_cuda(const Tensor& query, const Tensor& ref, int64_t k,
                                    const std::optional<Tensor>& query_lengths,
                                    const std::optional<Tensor>& ref_lengths, int64_t path) {
    return knn_cuda_metric(query, ref, k, query_lengths, ref_lengths, path, "l2");
}

std::tuple<Tensor, Tensor> knn_cuda_auto(const Tensor& query, const Tensor& ref, int64_t k,
                                         const std::optional<Tensor>& query_lengths,
                                         const std::optional<Tensor>& ref_lengths,
                                         const std::string& metric) {
    return knn_cuda_metric(query, ref, k, query_lengths, ref_lengths, PCOPS_KNN_AUTO, metric);
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("knn", TORCH_BOX(&pcops::knn_cpu_auto));
    m.impl("_knn_path", TORCH_BOX(&pcops::knn_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("knn", TORCH_BOX(&pcops::knn_cuda_auto));
    m.impl("_knn_path", TORCH_BOX(&pcops::knn_cuda));
}
#endif

// The private _knn_path is for comparing paths' results: not differentiable (knn's autograd
// formula is registered in pcops/knn.py); its Autograd key falls through (pcops/_loader.py).
