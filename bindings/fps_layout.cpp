// fps_layout.cpp -- binding of _fps_layout (what torch_cluster's fps over a batch vector needs
// before its one host synchronisation): checks, allocation, dispatch to kernels/fps_layout.*.
// No synchronisation: the caller reads `stats` (pcops.compat.torch_cluster.fps, one .tolist()).
#include <tuple>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "_fps_layout";

using Layout = std::tuple<Tensor, Tensor, Tensor>;

// Values need no check: ids only decide the outputs' values, never an address (the binary
// searches and runs stay inside [0, N)); a bad vector shows in stats[0].
Layout prepare(const Tensor& batch, double ratio, ScalarType dtype, int64_t batch_size,
               pcops_dtype* code) {
    check_index_tensor(kOp, "batch", batch, 1, "[N]");
    PCOPS_CHECK_VALUE(dtype_of(batch) == ScalarType::Long, "pcops.", kOp,
                      ": argument 'batch' must be int64, got ", describe(batch));
    PCOPS_CHECK_VALUE(ratio > 0 && ratio <= 1, "pcops.", kOp,
                      ": argument 'ratio' must be in (0, 1], got ", ratio);
    PCOPS_CHECK_VALUE(batch_size >= -1, "pcops.", kOp,
                      ": argument 'batch_size' must be >= 0 (or -1: no limit), got ", batch_size);
    PCOPS_CHECK_VALUE(dtype == ScalarType::Half || dtype == ScalarType::BFloat16 ||
                          dtype == ScalarType::Float || dtype == ScalarType::Double,
                      "pcops.", kOp,
                      ": argument 'dtype' must be float16, bfloat16, float32 or float64, got ",
                      torch::headeronly::toString(dtype));
    *code = to_pcops_dtype(dtype);
    const int64_t N = batch.size(0);
    return {allocate(kOp, "batch", {PCOPS_FPS_LAYOUT_STATS}, dtype_of(batch), batch),
            allocate(kOp, "batch", {N}, dtype_of(batch), batch),
            allocate(kOp, "batch", {N}, dtype_of(batch), batch)};
}

Layout fps_layout_cpu(const Tensor& batch, double ratio, ScalarType dtype, int64_t batch_size) {
    pcops_dtype code;
    Layout out = prepare(batch, ratio, dtype, batch_size, &code);
    const Tensor b = contiguous(kOp, "batch", batch);
    check_status(
        kOp, pcops_fps_layout_cpu(data<int64_t>(b), b.size(0), ratio, code, batch_size,
                                  data<int64_t>(std::get<0>(out)), data<int64_t>(std::get<1>(out)),
                                  data<int64_t>(std::get<2>(out))));
    return out;
}

#ifdef PCOPS_WITH_CUDA
Layout fps_layout_cuda(const Tensor& batch, double ratio, ScalarType dtype, int64_t batch_size) {
    check_cuda_tensor(kOp, "batch", batch);  // before the guard: it needs a CUDA device
    DeviceGuard guard(batch);
    pcops_dtype code;
    Layout out = prepare(batch, ratio, dtype, batch_size, &code);
    PCOPS_CHECK_VALUE(batch.size(0) <= INT32_MAX, "pcops.", kOp,
                      ": argument 'batch' may hold at most 2**31 - 1 points on CUDA, got ",
                      describe(batch));
    const Tensor b = contiguous(kOp, "batch", batch);
    check_cuda(
        kOp, pcops_fps_layout_cuda(data<int64_t>(b), b.size(0), ratio, code, batch_size,
                                   data<int64_t>(std::get<0>(out)), data<int64_t>(std::get<1>(out)),
                                   data<int64_t>(std::get<2>(out)), current_stream(batch)));
    return out;
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("_fps_layout", TORCH_BOX(&pcops::fps_layout_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("_fps_layout", TORCH_BOX(&pcops::fps_layout_cuda));
}
#endif
