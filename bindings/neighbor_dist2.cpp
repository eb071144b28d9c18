// neighbor_dist2.cpp -- binding of neighbor_dist2 (squared distance of each query to each of
// its listed neighbours): checks, allocation, dispatch to kernels/neighbor_dist2.*.
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "neighbor_dist2";

struct Dist2Call {
    QueryRef q;       // query [B,M,3], ref [B,N,3]: contiguous, in the compute dtype
    Tensor idx = undefined_tensor();  // [B,M,S] int64 or int32 (read as is), contiguous
    Tensor out = undefined_tensor();  // [B,M,S] in the compute dtype
    int64_t S;
};

// idx values need no check: any value outside [0, N) gives 0 (the contract, not an error),
// so the op is free of host synchronisation on CUDA and the same on both devices.
Dist2Call prepare(const Tensor& query, const Tensor& ref, const Tensor& idx) {
    Dist2Call c;
    c.q = check_query_ref(kOp, query, ref, std::nullopt, std::nullopt);
    check_index_tensor(kOp, "idx", idx, 3, "[B, M, S]", /*int32_ok=*/true);
    check_same_device(kOp, "idx", idx, "query", query);
    check_size(kOp, "idx", idx, 0, c.q.B, "the batch size B of 'query'");
    check_size(kOp, "idx", idx, 1, c.q.M, "M, dimension 1 of 'query'");
    c.S = idx.size(2);
    check_output_elements(kOp, "idx", {c.q.B, c.q.M, c.S}, query.element_size(), query);
    c.idx = contiguous(kOp, "idx", idx);
    c.out = allocate(kOp, "idx", {c.q.B, c.q.M, c.S}, dtype_of(c.q.query), c.q.query);
    return c;
}

Tensor finish(const Dist2Call& c, const Tensor& query) {
    return to_dist_dtype(kOp, "idx", c.out, dtype_of(query));
}

Tensor neighbor_dist2_cpu(const Tensor& query, const Tensor& ref, const Tensor& idx) {
    Dist2Call c = prepare(query, ref, idx);
    check_status(
        kOp, pcops_neighbor_dist2_cpu(to_pcops_dtype(dtype_of(c.q.query)), c.q.query.data_ptr(),
                                      c.q.ref.data_ptr(), c.idx.data_ptr(), to_index_dtype(c.idx),
                                      c.q.B, c.q.M, c.q.N, c.S, c.out.data_ptr()));
    return finish(c, query);
}

#ifdef PCOPS_WITH_CUDA
Tensor neighbor_dist2_cuda(const Tensor& query, const Tensor& ref, const Tensor& idx) {
    check_cuda_tensor(kOp, "query", query);
    DeviceGuard guard(query);
    Dist2Call c = prepare(query, ref, idx);
    check_cuda(kOp, pcops_neighbor_dist2_cuda(to_pcops_dtype(dtype_of(c.q.query)),
                                              c.q.query.data_ptr(), c.q.ref.data_ptr(),
                                              c.idx.data_ptr(), to_index_dtype(c.idx), c.q.B, c.q.M,
                                              c.q.N, c.S, c.out.data_ptr(), current_stream(query)));
    return finish(c, query);
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("neighbor_dist2", TORCH_BOX(&pcops::neighbor_dist2_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("neighbor_dist2", TORCH_BOX(&pcops::neighbor_dist2_cuda));
}
#endif
