// utils.h -- input checks and small helpers shared by every binding in bindings/.
//
// The bindings use PyTorch's stable ABI only (torch/csrc/stable, torch/headeronly and the C
// shims below them; setup.py defines TORCH_TARGET_VERSION, which makes every other torch header
// an error), so one build loads into every torch release from the target on. bindings/README.md
// lists what the stable API lacks and where pcops does it instead.
//
// Every check names the op and the argument and says what was expected and what came:
//   pcops.knn: argument 'query' must be a tensor of shape [B, M, 3], got a 2-D tensor of shape [5, 3]
// PCOPS_CHECK_VALUE raises ValueError and PCOPS_CHECK_TYPE raises TypeError in Python (the
// stable ABI carries only std::runtime_error; the message starts with "ValueError: " or
// "TypeError: " and pcops._C's call hook turns it into that exception, bindings/module.cpp).
// PCOPS_CHECK raises RuntimeError. The message pieces are streamed (operator<<) only on failure.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>

#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "../kernels/pcops.h"

namespace pcops {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;

// ---- Errors ----------------------------------------------------------------------------------
enum class ErrorKind { Runtime, Value, Type, OutOfMemory };

// Throws the exception pcops raises for `kind` (see the top of this file).
[[noreturn]] void raise(ErrorKind kind, const std::string& message);

namespace detail {
template <typename... Args>
[[noreturn]] C10_NOINLINE void fail(ErrorKind kind, const Args&... args) {
    std::ostringstream s;
    (s << ... << args);
    raise(kind, s.str());
}
}  // namespace detail

#define PCOPS_CHECK_KIND_(kind, cond, ...)                                   \
    do {                                                                     \
        if (C10_UNLIKELY(!(cond))) ::pcops::detail::fail(kind, __VA_ARGS__); \
    } while (0)
#define PCOPS_CHECK(cond, ...) PCOPS_CHECK_KIND_(::pcops::ErrorKind::Runtime, cond, __VA_ARGS__)
#define PCOPS_CHECK_VALUE(cond, ...) PCOPS_CHECK_KIND_(::pcops::ErrorKind::Value, cond, __VA_ARGS__)
#define PCOPS_CHECK_TYPE(cond, ...) PCOPS_CHECK_KIND_(::pcops::ErrorKind::Type, cond, __VA_ARGS__)

// ---- Tensors through the stable ABI ---------------------------------------------------------
// The dtype of `t` (one shim call for the dtypes pcops takes; the stable Tensor::scalar_type()
// compares with up to twenty dtype getters).
ScalarType dtype_of(const Tensor& t);

// An undefined tensor that costs no allocation: a copy of one shared undefined handle. A
// default-constructed stable Tensor allocates a handle and its control block (and frees both
// later), a few hundred instructions per tensor and call; the bindings start their tensor
// members from this instead (assigning a stable Tensor replaces its handle, never changes the
// shared one).
const Tensor& undefined_tensor();

// "cpu", "cuda:0", "meta": the device of `t` as torch prints it.
std::string device_string(const Tensor& t);

// "a 3-D Float tensor of shape [4, 5, 3] on cuda:0"
std::string describe(const Tensor& t);

// "[4, 5, 3]"
std::string shape_string(IntArrayRef sizes);

// `t` itself when contiguous (no dispatch), else a contiguous copy.
Tensor as_contiguous(const Tensor& t);

// `t` itself when of dtype `type` (no dispatch), else a copy in `type`.
Tensor to_dtype(const Tensor& t, ScalarType type);

// A new contiguous output of `sizes` and `type` on the device of `like`, from the empty_strided
// shim (as cheap as at::empty; torch's empty through the dispatcher costs ~1.5 us more). The
// shim skips torch's fill of uninitialised memory on the CPU (torch.use_deterministic_algorithms
// with torch.utils.deterministic.fill_uninitialized_memory, which the tests use to poison
// outputs), so while that is on (call_state) outputs come from torch's empty, which fills them.
Tensor new_output(IntArrayRef sizes, ScalarType type, const Tensor& like);

// A view of `base`'s storage with contiguous `sizes` (no dispatch, no autograd view): a fresh
// output shrunk to its final size, or an output carved from a larger allocation.
Tensor reshaped_view(const Tensor& base, IntArrayRef sizes);

// `t` itself on the CPU, else a copy on the CPU (a host synchronisation).
Tensor to_host(const Tensor& t);

// The data of a tensor whose dtype the caller checked.
template <typename T = void>
inline T* data(const Tensor& t) {
    return static_cast<T*>(t.data_ptr());
}

// ---- Input checks ---------------------------------------------------------------------------

// `t` is a floating point tensor of rank `rank` whose last dimension is `last_dim`
// (`last_dim` < 0: any). `shape` is the expected shape in words, e.g. "[B, N, 3]".
void check_float_tensor(const char* op, const char* name, const Tensor& t, int64_t rank,
                        int64_t last_dim, const char* shape);

// `t` is float32, float64, float16 or bfloat16 (check_float_tensor lets float8 types through;
// they would reach to_pcops_dtype and fail there with a message that names no op).
void check_float_dtype(const char* op, const char* name, const Tensor& t);

// `t` is an int64 (or, with int32_ok, an int32) tensor of rank `rank` ("[B, M, S]" in words).
void check_index_tensor(const char* op, const char* name, const Tensor& t, int64_t rank,
                        const char* shape, bool int32_ok = false);

// The pcops_index_dtype of an index tensor checked with int32_ok.
inline pcops_index_dtype to_index_dtype(const Tensor& t) {
    return dtype_of(t) == ScalarType::Int ? PCOPS_INDEX_INT32 : PCOPS_INDEX_INT64;
}

// `t` lives on the same device as `ref` (named `ref_name`).
void check_same_device(const char* op, const char* name, const Tensor& t, const char* ref_name,
                       const Tensor& ref);

// size(dim) of `t` equals `expected` (named `what`, e.g. "the batch size B of 'xyz'").
void check_size(const char* op, const char* name, const Tensor& t, int64_t dim, int64_t expected,
                const char* what);

// An integer argument (npoint, k, nsample) is >= 1.
void check_positive(const char* op, const char* name, int64_t value);

// A radius is finite and > 0.
void check_radius(const char* op, const char* name, double radius);

// Optional per-batch lengths: int64 [B] on the device of `like` (the argument `like_name`),
// values in [0, N] (values checked when check_values_now(like)). Returns the contiguous tensor
// or nullopt. `bound_name` names the upper bound in the message ("N"; "M" for query lengths).
std::optional<Tensor> check_lengths(const char* op, const char* name,
                                    const std::optional<Tensor>& lengths, int64_t B, int64_t N,
                                    const Tensor& like, const char* like_name,
                                    const char* bound_name = "N");

// ---- Value checks: exact on the CPU, opt-in on CUDA ------------------------------------
// Bindings check shapes, dtypes, devices and sizes, which costs no device read. The VALUES of
// index inputs (idx, lengths, start) are checked where that is free: always on the CPU. On
// CUDA a value check is a device-to-host copy, i.e. a host synchronisation per call, so it
// runs only in debug mode (pcops.set_debug_checks(True), below) and never while the current
// stream captures a CUDA graph. Without it the kernels still never access memory out of
// bounds: lengths are clamped to [0, N], start is taken modulo the length, gather indices
// outside [0, N) read as -1 (kernels/pcops.h).

// Debug mode for CUDA value checks (process-wide; off by default).
bool debug_checks();
bool set_debug_checks(bool enabled);  // returns the previous setting

// Whether the values of index tensors on `t`'s device are checked now: always on the CPU; on
// CUDA in debug mode, outside graph capture.
bool check_values_now(const Tensor& t);

// [min, max] of an integer tensor (aten::aminmax; on CUDA one device-to-host copy of each);
// numel() must be > 0. Only under check_values_now().
std::pair<int64_t, int64_t> value_range(const Tensor& t);

// Values of the int64 tensor `t` lie in [lo, hi) (`range` spells the range in words, e.g.
// "[-1, N)"), when check_values_now(t).
void check_index_values(const char* op, const char* name, const Tensor& t, int64_t lo, int64_t hi,
                        const char* range);

// ---- Sizes ---------------------------------------------------------------------------------
// A cloud holds at most 2**31 - 1 points (`count` of `name`'s dimension named `letter`, e.g.
// N): indices inside a cloud are 32-bit on CUDA, and the CPU keeps the same limit so that
// both accept the same inputs.
void check_points_per_cloud(const char* op, const char* name, int64_t count, const char* letter);

// The outputs of `shape` (elements of `elem_bytes` bytes: the sum over the outputs of that
// shape) fit in the memory of `like`'s device; otherwise a ValueError naming the op and the
// argument `name` that sized them (k, nsample, npoint), instead of an allocator message.
// Overflow-safe. Call it before allocating, e.g. for knn's dist2 and idx [B, M, k]:
//   check_output_elements(kOp, "k", {q.B, q.M, k}, q.query.element_size() + 8, query);
void check_output_elements(const char* op, const char* name, IntArrayRef shape, size_t elem_bytes,
                           const Tensor& like);

// ---- The query/ref pair of knn, ball_query (and three_nn) ----------------------------------
// query [B, M, 3] and ref [B, N, 3]: floating point, same dtype, same device, same B; M and N
// at most 2**31 - 1; optional query_lengths (values in [0, M]) and ref_lengths ([0, N]).
// Returns them contiguous in the compute dtype (float32 for half types). Usage:
//   QueryRef q = check_query_ref(kOp, query, ref, query_lengths, ref_lengths);
//   check_output_elements(kOp, "k", {q.B, q.M, k}, q.query.element_size() + 8, query);
//   ... kernel(q.query.data_ptr(), q.ref.data_ptr(), ptr_or_null(q.query_lengths), ...)
struct QueryRef {
    Tensor query = undefined_tensor(), ref = undefined_tensor();
    std::optional<Tensor> query_lengths, ref_lengths;
    int64_t B, M, N;
};
// query_name / ref_name: the arguments' names in the messages (three_nn_pointnet2: unknown, known).
// any_dim: points of any dimension D >= 1 ([B, M, D] / [B, N, D], one D for both; knn), not 3.
QueryRef check_query_ref(const char* op, const Tensor& query, const Tensor& ref,
                         const std::optional<Tensor>& query_lengths,
                         const std::optional<Tensor>& ref_lengths, const char* query_name = "query",
                         const char* ref_name = "ref", bool any_dim = false);

// ---- Allocation: a failure names the op and the argument -----------------------------------
// Every allocation of a binding goes through these: when the allocator refuses (the CPU
// allocator's or the CUDA caching allocator's error), the call raises torch.OutOfMemoryError
// naming the op, the argument, the shape, the dtype and the bytes, with the allocator's own
// message after them (inputs expanded to a huge shape cost no memory until a copy is made).
// The stable ABI carries only std::runtime_error: the message starts with "OutOfMemoryError: ",
// which pcops._C's call hook turns into torch.OutOfMemoryError (bindings/module.cpp).

// new_output(sizes, type, like) for an output or a buffer sized by argument `name` (nullptr: a
// workspace, sized by the inputs together).
Tensor allocate(const char* op, const char* name, IntArrayRef sizes, ScalarType type,
                const Tensor& like);

// `t` (argument `name`) contiguous: itself, or a copy.
Tensor contiguous(const char* op, const char* name, const Tensor& t);

// `t` (argument `name`) contiguous in the dtype the kernels compute in: float32 for
// float16/bfloat16, the dtype itself for float32/float64 (a view when nothing changes).
Tensor to_compute_dtype(const char* op, const char* name, const Tensor& t);

// A result `t` in dtype `type` (itself when it has it): the copy is sized by argument `name`.
Tensor to_dtype(const char* op, const char* name, const Tensor& t, ScalarType type);

pcops_dtype to_pcops_dtype(ScalarType type);

// A distance result `t` (float32 or float64, >= 0) in dtype `type`, as to_dtype, keeping the
// saturation rule of kernels/geometry.h: +inf means an empty slot, so a finite distance too
// large for a float16 / bfloat16 output becomes that type's largest finite value instead of
// rounding to +inf (+inf and NaN stay). `t` is the op's own contiguous buffer and may be changed
// in place.
Tensor to_dist_dtype(const char* op, const char* name, const Tensor& t, ScalarType type);

// The data of an optional int64 tensor (lengths, start, groups), or NULL for the C API.
inline const int64_t* ptr_or_null(const std::optional<Tensor>& t) {
    return t ? data<const int64_t>(*t) : nullptr;
}

// A workspace of `bytes` on the device of `like`, or an undefined tensor (no allocation, no
// allocator call) for 0 bytes; workspace_ptr gives its data or NULL.
Tensor workspace_tensor(const char* op, size_t bytes, const Tensor& like);
inline void* workspace_ptr(const Tensor& workspace) {
    return workspace.defined() ? workspace.data_ptr() : nullptr;
}

// Raises if a CPU kernel returned an error.
void check_status(const char* op, pcops_status status);

// ---- Forced paths (tests, benchmarks): the private ops _<op>_path -------------------------
// `path` is an id of the op's table (kernels/paths.h; `table` is its name there, e.g. "knn")
// that runs on the device (`cuda`) and takes `dtype`; otherwise a ValueError naming the op,
// the path and the paths that do run there. Returns the path's name.
const char* check_path(const char* op, const char* table, int64_t path, bool cuda,
                       pcops_dtype dtype);

// A forced path (`name`, from check_path) whose kernel refused the inputs: a ValueError that
// says so with `sizes` (e.g. "B = 2, N = 10, k = 3"). A forced path never falls back.
[[noreturn]] void forced_path_refused(const char* op, const char* name, const std::string& sizes);

// ---- What the call hook read in Python ----------------------------------------------------
// Settings of torch that the stable ABI cannot read, read by pcops._C's call hook in Python
// for the current call (bindings/module.cpp); all off when the op is not called from Python.
struct CallState {
    // torch.cuda.set_sync_debug_mode (0 off, 1 warn, 2 error); read for the ops that
    // synchronise with the host (circle_nms, neighbor_edges), else 0
    int sync_debug_mode = 0;
    // torch.use_deterministic_algorithms(True) with fill_uninitialized_memory (new_output)
    bool fill_uninitialized = false;
};
CallState& call_state();  // this thread's

#ifdef PCOPS_WITH_CUDA
// Raises unless `t` is a CUDA tensor. A CUDA kernel is chosen when any argument is on CUDA,
// so this catches a CPU `t` mixed with CUDA arguments before a device guard is taken on it.
void check_cuda_tensor(const char* op, const char* name, const Tensor& t);

// Raises if a CUDA launcher returned an error.
void check_cuda(const char* op, cudaError_t err);

// The current CUDA stream of the device of `t` (torch's, through the stream shim).
cudaStream_t current_stream(const Tensor& t);

// Makes the device of `t` current for its lifetime (the stable DeviceGuard).
class DeviceGuard {
  public:
    explicit DeviceGuard(const Tensor& t) : guard_(t.get_device_index()) {}

  private:
    torch::stable::accelerator::DeviceGuard guard_;
};

// Before a host synchronisation of `op` (whose output size depends on the data): raises in sync
// debug mode "error", as torch's synchronising calls do.
void check_sync_allowed(const char* op);

// Waits for `stream`: torch's stream synchronisation in sync debug mode "warn" (it warns),
// else cudaStreamSynchronize.
void synchronize(const char* op, cudaStream_t stream, const Tensor& like);
#endif

}  // namespace pcops
