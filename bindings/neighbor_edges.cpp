// neighbor_edges.cpp -- binding of neighbor_edges (neighbour lists -> COO edges [2, E]): checks,
// allocation, the one read of E, dispatch to kernels/neighbor_edges.*.
#include <torch/library.h>

#include "utils.h"

#ifdef PCOPS_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace pcops {
namespace {

constexpr const char* kOp = "neighbor_edges";

struct EdgesCall {
    at::Tensor idx;  // [B,M,S] int64, contiguous
    std::optional<at::Tensor> count, row_offset, col_offset;  // [B,M], [B], [B]
    int64_t B, M, N, S;
};

std::optional<at::Tensor> check_optional(const std::optional<at::Tensor>& t, const char* name,
                                         const at::Tensor& idx, int64_t rank, const char* shape) {
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
EdgesCall prepare(const at::Tensor& idx, int64_t num_ref, const std::optional<at::Tensor>& count,
                  const std::optional<at::Tensor>& row_offset,
                  const std::optional<at::Tensor>& col_offset) {
    check_index_tensor(kOp, "idx", idx, 3, "[B, M, S]");
    TORCH_CHECK_VALUE(num_ref >= 0, "pcops.", kOp, ": argument 'num_ref' must be >= 0, got ",
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

at::Tensor neighbor_edges_cpu(const at::Tensor& idx, int64_t num_ref,
                              const std::optional<at::Tensor>& count,
                              const std::optional<at::Tensor>& row_offset,
                              const std::optional<at::Tensor>& col_offset) {
    EdgesCall c = prepare(idx, num_ref, count, row_offset, col_offset);
    const int64_t R = c.B * c.M;
    at::Tensor ends = allocate(kOp, "idx", {R}, c.idx.options());
    check_status(kOp, pcops_neighbor_edges_count_cpu(c.idx.data_ptr<int64_t>(),
                                                     ptr_or_null(c.count), c.B, c.M, c.N, c.S,
                                                     ends.data_ptr<int64_t>()));
    const int64_t E = R > 0 ? ends.data_ptr<int64_t>()[R - 1] : 0;
    at::Tensor edges = allocate(kOp, "idx", {2, E}, c.idx.options());
    check_status(kOp, pcops_neighbor_edges_write_cpu(
                          c.idx.data_ptr<int64_t>(), ptr_or_null(c.count),
                          ptr_or_null(c.row_offset), ptr_or_null(c.col_offset), c.B, c.M, c.N,
                          c.S, ends.data_ptr<int64_t>(), edges.data_ptr<int64_t>()));
    return edges;
}

#ifdef PCOPS_WITH_CUDA
at::Tensor neighbor_edges_cuda(const at::Tensor& idx, int64_t num_ref,
                               const std::optional<at::Tensor>& count,
                               const std::optional<at::Tensor>& row_offset,
                               const std::optional<at::Tensor>& col_offset) {
    check_cuda_tensor(kOp, "idx", idx);  // before the guard: it needs a CUDA device
    c10::cuda::CUDAGuard guard(idx.device());
    EdgesCall c = prepare(idx, num_ref, count, row_offset, col_offset);
    const int64_t R = c.B * c.M;
    TORCH_CHECK_VALUE(R <= INT32_MAX, "pcops.", kOp, ": argument 'idx' may hold at most 2**31 - 1 "
                      "rows B*M on CUDA, got ", describe(idx));
    if (R == 0) return at::empty({2, 0}, c.idx.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    at::Tensor ends = allocate(kOp, "idx", {R}, c.idx.options());
    at::Tensor workspace =
        allocate(kOp, nullptr, {(int64_t)pcops_neighbor_edges_cuda_workspace_bytes(c.B, c.M)},
                 c.idx.options().dtype(at::kByte));
    check_cuda(kOp, pcops_neighbor_edges_count_cuda(c.idx.data_ptr<int64_t>(),
                                                    ptr_or_null(c.count), c.B, c.M, c.N, c.S,
                                                    workspace.data_ptr(),
                                                    ends.data_ptr<int64_t>(), stream));
    // The one host synchronisation: the output size depends on the data.
    int64_t E = 0;
    c10::cuda::memcpy_and_sync(&E, ends.data_ptr<int64_t>() + R - 1, sizeof(int64_t),
                               cudaMemcpyDeviceToHost, stream);
    at::Tensor edges = allocate(kOp, "idx", {2, E}, c.idx.options());
    check_cuda(kOp, pcops_neighbor_edges_write_cuda(
                        c.idx.data_ptr<int64_t>(), ptr_or_null(c.count),
                        ptr_or_null(c.row_offset), ptr_or_null(c.col_offset), c.B, c.M, c.N,
                        c.S, ends.data_ptr<int64_t>(), E, edges.data_ptr<int64_t>(), stream));
    return edges;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) { m.impl("neighbor_edges", &neighbor_edges_cpu); }

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) { m.impl("neighbor_edges", &neighbor_edges_cuda); }
#endif

}  // namespace pcops
