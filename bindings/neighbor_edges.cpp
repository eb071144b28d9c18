// neighbor_edges.cpp -- binding of neighbor_edges (neighbour lists -> COO edges [2, E]): checks,
// allocation, the one read of E, dispatch to kernels/neighbor_edges.*.
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "neighbor_edges";

struct EdgesCall {
    Tensor idx = undefined_tensor();  // [B,M,S] int64, contiguous
    std::optional<Tensor> count, row_offset, col_offset;  // [B,M], [B], [B]
    int64_t B, M, N, S;
};

std::optional<Tensor> check_optional(const std::optional<Tensor>& t, const char* name,
                                     const Tensor& idx, int64_t rank, const char* shape) {
    if (!t.has_value()) return std::nullopt;
    check_index_tensor(kOp, name, *t, rank, shape);
    check_same_device(kOp, name, *t, "idx", idx);
    for (int64_t d = 0; d < rank; ++d)
        check_size(kOp, name, *t, d, idx.size(d),
                   d == 0 ? "the batch size B of 'idx'" : "M, dimension 1 of 'idx'");
    return contiguous(kOp, name, *t);
}

// Values need no check: count, offsets and idx only decide which slots are edges and the
// numbers written, never an address (idx outside [0, num_ref) is not an edge).
EdgesCall prepare(const Tensor& idx, int64_t num_ref, const std::optional<Tensor>& count,
                  const std::optional<Tensor>& row_offset,
                  const std::optional<Tensor>& col_offset) {
    check_index_tensor(kOp, "idx", idx, 3, "[B, M, S]");
    PCOPS_CHECK_VALUE(num_ref >= 0, "pcops.", kOp, ": argument 'num_ref' must be >= 0, got ",
                      num_ref);
    EdgesCall c;
    c.B = idx.size(0);
    c.M = idx.size(1);
    c.S = idx.size(2);
    c.N = num_ref;
    c.idx = contiguous(kOp, "idx", idx);
    c.count = check_optional(count, "count", idx, 2, "[B, M]");
    c.row_offset = check_optional(row_offset, "row_offset", idx, 1, "[B]");
    c.col_offset = check_optional(col_offset, "col_offset", idx, 1, "[B]");
    return c;
}

Tensor neighbor_edges_cpu(const Tensor& idx, int64_t num_ref, const std::optional<Tensor>& count,
                          const std::optional<Tensor>& row_offset,
                          const std::optional<Tensor>& col_offset) {
    EdgesCall c = prepare(idx, num_ref, count, row_offset, col_offset);
    const int64_t R = c.B * c.M;
    Tensor ends = allocate(kOp, "idx", {R}, ScalarType::Long, c.idx);
    check_status(kOp, pcops_neighbor_edges_count_cpu(data<int64_t>(c.idx), ptr_or_null(c.count),
                                                     c.B, c.M, c.N, c.S, data<int64_t>(ends)));
    const int64_t E = R > 0 ? data<int64_t>(ends)[R - 1] : 0;
    Tensor edges = allocate(kOp, "idx", {2, E}, ScalarType::Long, c.idx);
    check_status(kOp, pcops_neighbor_edges_write_cpu(
                          data<int64_t>(c.idx), ptr_or_null(c.count), ptr_or_null(c.row_offset),
                          ptr_or_null(c.col_offset), c.B, c.M, c.N, c.S,
                          static_cast<int64_t*>(workspace_ptr(ends)), data<int64_t>(edges)));
    return edges;
}

#ifdef PCOPS_WITH_CUDA
Tensor neighbor_edges_cuda(const Tensor& idx, int64_t num_ref, const std::optional<Tensor>& count,
                           const std::optional<Tensor>& row_offset,
                           const std::optional<Tensor>& col_offset) {
    check_cuda_tensor(kOp, "idx", idx);  // before the guard: it needs a CUDA device
    DeviceGuard guard(idx);
    EdgesCall c = prepare(idx, num_ref, count, row_offset, col_offset);
    const int64_t R = c.B * c.M;
    PCOPS_CHECK_VALUE(R <= INT32_MAX, "pcops.", kOp,
                      ": argument 'idx' may hold at most 2**31 - 1 "
                      "rows B*M on CUDA, got ",
                      describe(idx));
    if (R == 0) return allocate(kOp, "idx", {2, 0}, ScalarType::Long, c.idx);
    check_sync_allowed(kOp);  // sync debug mode "error": raise before launching anything
    cudaStream_t stream = current_stream(idx);
    Tensor ends = allocate(kOp, "idx", {R}, ScalarType::Long, c.idx);
    Tensor workspace =
        workspace_tensor(kOp, pcops_neighbor_edges_cuda_workspace_bytes(c.B, c.M), c.idx);
    check_cuda(kOp, pcops_neighbor_edges_count_cuda(data<int64_t>(c.idx), ptr_or_null(c.count), c.B,
                                                    c.M, c.N, c.S, workspace_ptr(workspace),
                                                    data<int64_t>(ends), stream));
    // The one host synchronisation: the output size depends on the data.
    int64_t E = 0;
    check_cuda(kOp, cudaMemcpyAsync(&E, data<int64_t>(ends) + R - 1, sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    synchronize(kOp, stream, idx);
    Tensor edges = allocate(kOp, "idx", {2, E}, ScalarType::Long, c.idx);
    check_cuda(kOp, pcops_neighbor_edges_write_cuda(
                        data<int64_t>(c.idx), ptr_or_null(c.count), ptr_or_null(c.row_offset),
                        ptr_or_null(c.col_offset), c.B, c.M, c.N, c.S, data<int64_t>(ends), E,
                        data<int64_t>(edges), stream));
    return edges;
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("neighbor_edges", TORCH_BOX(&pcops::neighbor_edges_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("neighbor_edges", TORCH_BOX(&pcops::neighbor_edges_cuda));
}
#endif
