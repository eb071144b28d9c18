// utils.cpp -- input checks shared by every binding (see utils.h).
#include "utils.h"

#include <limits>

#include <atomic>
#include <cmath>
#include <sstream>

#include <unistd.h>

#ifdef PCOPS_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace pcops {

static std::string shape_string(at::IntArrayRef sizes) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
    s << "]";
    return s.str();
}

std::string describe(const at::Tensor& t) {
    if (!t.defined()) return "an undefined tensor";
    std::ostringstream s;
    s << "a " << t.dim() << "-D " << c10::toString(t.scalar_type()) << " tensor of shape "
      << shape_string(t.sizes()) << " on " << t.device();
    return s.str();
}

void check_float_dtype(const char* op, const char* name, const at::Tensor& t) {
    const auto type = t.scalar_type();
    TORCH_CHECK_TYPE(type == at::kFloat || type == at::kDouble || type == at::kHalf ||
                         type == at::kBFloat16,
                     "pcops.", op, ": argument '", name,
                     "' must be a floating point tensor (float32, float64, float16 or bfloat16), got ",
                     describe(t));
}

void check_float_tensor(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                        int64_t last_dim, const char* shape) {
    TORCH_CHECK_VALUE(t.defined(), "pcops.", op, ": argument '", name, "' must be a tensor of shape ",
                      shape, ", got an undefined tensor");
    check_float_dtype(op, name, t);  // float8 and other exotic floating types are rejected too
    TORCH_CHECK_VALUE(t.dim() == rank && (last_dim < 0 || t.size(-1) == last_dim), "pcops.", op,
                      ": argument '", name, "' must be a tensor of shape ", shape, ", got ",
                      describe(t));
}

void check_index_tensor(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                        const char* shape, bool int32_ok) {
    TORCH_CHECK_VALUE(t.defined(), "pcops.", op, ": argument '", name, "' must be a tensor of shape ",
                      shape, ", got an undefined tensor");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || (int32_ok && t.scalar_type() == at::kInt),
                     "pcops.", op, ": argument '", name, "' must be an ",
                     int32_ok ? "int64 or int32" : "int64", " tensor, got ", describe(t));
    TORCH_CHECK_VALUE(t.dim() == rank, "pcops.", op, ": argument '", name,
                      "' must be a tensor of shape ", shape, ", got ", describe(t));
}

void check_same_device(const char* op, const char* name, const at::Tensor& t,
                       const char* ref_name, const at::Tensor& ref) {
    TORCH_CHECK_VALUE(t.device() == ref.device(), "pcops.", op, ": argument '", name,
                      "' must be on the same device as '", ref_name, "' (", ref.device(), "), got ",
                      describe(t));
}

void check_size(const char* op, const char* name, const at::Tensor& t, int64_t dim,
                int64_t expected, const char* what) {
    TORCH_CHECK_VALUE(t.size(dim) == expected, "pcops.", op, ": argument '", name, "' must have ",
                      expected, " (", what, ") in dimension ", dim, ", got ", describe(t));
}

void check_positive(const char* op, const char* name, int64_t value) {
    TORCH_CHECK_VALUE(value >= 1, "pcops.", op, ": argument '", name, "' must be >= 1, got ", value);
}

void check_radius(const char* op, const char* name, double radius) {
    TORCH_CHECK_VALUE(std::isfinite(radius) && radius > 0, "pcops.", op, ": argument '", name,
                      "' must be finite and > 0, got ", radius);
}

static std::atomic<bool> g_debug_checks{false};

bool debug_checks() { return g_debug_checks.load(); }

bool set_debug_checks(bool enabled) { return g_debug_checks.exchange(enabled); }

bool check_values_now(const at::Tensor& t) {
    if (!t.is_cuda()) return true;
    if (!debug_checks()) return false;
#ifdef PCOPS_WITH_CUDA
    c10::cuda::CUDAGuard guard(t.device());
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
#else
    return false;
#endif
}

std::pair<int64_t, int64_t> value_range(const at::Tensor& t) {
    // An expanded input (stride 0) repeats its values: reduce one copy of them, since aminmax
    // would first materialise the expansion (2**40 elements of an expanded idx cost no memory).
    at::Tensor values = t;
    for (int64_t d = 0; d < values.dim(); ++d)
        if (values.stride(d) == 0 && values.size(d) > 1) values = values.narrow(d, 0, 1);
    auto mm = at::aminmax(values);
    at::Tensor both = at::stack({std::get<0>(mm), std::get<1>(mm)}).to(at::kLong).cpu();
    const int64_t* p = both.data_ptr<int64_t>();
    return {p[0], p[1]};
}

void check_index_values(const char* op, const char* name, const at::Tensor& t, int64_t lo,
                        int64_t hi, const char* range) {
    if (t.numel() == 0 || !check_values_now(t)) return;
    auto [min, max] = value_range(t);
    TORCH_CHECK_VALUE(min >= lo && max < hi, "pcops.", op, ": argument '", name,
                      "' must hold values in ", range, " = [", lo, ", ", hi, "), got values in [",
                      min, ", ", max, "]");
}

void check_points_per_cloud(const char* op, const char* name, int64_t count,
                            const char* letter) {
    TORCH_CHECK_VALUE(count <= INT32_MAX, "pcops.", op, ": argument '", name, "' has ", letter,
                      " = ", count, " points per cloud; at most 2**31 - 1 = ", INT32_MAX,
                      " are supported");
}

// Bytes of memory of `t`'s device: the GPU's global memory, or the host's physical memory.
static double device_memory_bytes(const at::Tensor& t) {
#ifdef PCOPS_WITH_CUDA
    if (t.is_cuda()) return (double)at::cuda::getDeviceProperties(t.device().index())->totalGlobalMem;
#endif
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 1e18;
}

static std::string bytes_string(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) {
        bytes /= 1024;
        ++u;
    }
    std::ostringstream s;
    s.precision(3);
    s << bytes << " " << units[u];
    return s.str();
}

void check_output_elements(const char* op, const char* name, at::IntArrayRef shape,
                           size_t elem_bytes, const at::Tensor& like) {
    double elements = 1;  // in double: no overflow, and exact enough for a size check
    for (int64_t s : shape) elements *= (double)s;
    const double bytes = elements * (double)elem_bytes;
    const double memory = device_memory_bytes(like);
    TORCH_CHECK_VALUE(bytes <= memory, "pcops.", op, ": argument '", name,
                      "' asks for an output of shape ", shape_string(shape), " (", elements,
                      " elements, ", bytes_string(bytes), "), more than the memory of ",
                      like.device(), " (", bytes_string(memory), ")");
}

QueryRef check_query_ref(const char* op, const at::Tensor& query, const at::Tensor& ref,
                         const std::optional<at::Tensor>& query_lengths,
                         const std::optional<at::Tensor>& ref_lengths, const char* query_name,
                         const char* ref_name, bool any_dim) {
    if (any_dim) {
        check_float_tensor(op, query_name, query, 3, -1, "[B, M, D] with D >= 1");
        check_float_tensor(op, ref_name, ref, 3, -1, "[B, N, D] with D >= 1");
        TORCH_CHECK_VALUE(query.size(2) >= 1, "pcops.", op, ": argument '", query_name,
                          "' must be a tensor of shape [B, M, D] with D >= 1, got ",
                          describe(query));
    } else {
        check_float_tensor(op, query_name, query, 3, 3, "[B, M, 3]");
        check_float_tensor(op, ref_name, ref, 3, 3, "[B, N, 3]");
    }
    check_same_device(op, ref_name, ref, query_name, query);
    TORCH_CHECK_TYPE(ref.scalar_type() == query.scalar_type(), "pcops.", op, ": argument '",
                     ref_name, "' must have the dtype of '", query_name, "' (",
                     c10::toString(query.scalar_type()), "), got ", describe(ref));
    if (ref.size(0) != query.size(0)) {  // the message is built only on failure
        const std::string batch_of = std::string("the batch size B of '") + query_name + "'";
        check_size(op, ref_name, ref, 0, query.size(0), batch_of.c_str());
    }
    if (any_dim && ref.size(2) != query.size(2)) {
        const std::string dim_of = std::string("the point dimension D of '") + query_name + "'";
        check_size(op, ref_name, ref, 2, query.size(2), dim_of.c_str());
    }
    QueryRef q;
    q.B = query.size(0);
    q.M = query.size(1);
    q.N = ref.size(1);
    check_points_per_cloud(op, query_name, q.M, "M");
    check_points_per_cloud(op, ref_name, q.N, "N");
    q.query_lengths =
        check_lengths(op, "query_lengths", query_lengths, q.B, q.M, query, query_name, "M");
    q.ref_lengths = check_lengths(op, "ref_lengths", ref_lengths, q.B, q.N, query, query_name);
    q.query = to_compute_dtype(op, query_name, query);
    q.ref = to_compute_dtype(op, ref_name, ref);
    return q;
}

std::optional<at::Tensor> check_lengths(const char* op, const char* name,
                                        const std::optional<at::Tensor>& lengths, int64_t B,
                                        int64_t N, const at::Tensor& like,
                                        const char* like_name, const char* bound_name) {
    if (!lengths.has_value() || !lengths->defined()) return std::nullopt;
    const at::Tensor& t = *lengths;
    check_index_tensor(op, name, t, 1, "[B]");
    check_size(op, name, t, 0, B, "the batch size B");
    check_same_device(op, name, t, like_name, like);
    if (B > 0 && check_values_now(t)) {
        auto [lo, hi] = value_range(t);
        TORCH_CHECK_VALUE(lo >= 0 && hi <= N, "pcops.", op, ": argument '", name,
                          "' must hold values in [0, ", bound_name, "] = [0, ", N,
                          "], got values in [", lo, ", ", hi, "]");
    }
    return contiguous(op, name, t);
}

// The allocator refused `sizes` of `type` on `device` for `what` ("a tensor for argument 'k'").
[[noreturn]] static void allocation_failed(const char* op, const std::string& what,
                                           at::IntArrayRef sizes, at::ScalarType type,
                                           const at::Device& device, const char* reason) {
    double elements = 1;
    for (int64_t s : sizes) elements *= (double)s;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "pcops.", op, ": out of memory: cannot allocate ",
                     what, " (", shape_string(sizes), ", ", c10::toString(type), ", ",
                     bytes_string(elements * (double)c10::elementSize(type)), ") on ", device,
                     " (", reason, ")");
    TORCH_INTERNAL_ASSERT(false);
}

at::Tensor allocate(const char* op, const char* name, at::IntArrayRef sizes,
                    const at::TensorOptions& options) {
    try {
        return at::empty(sizes, options);
    } catch (const c10::Error& e) {
        allocation_failed(op, name ? std::string("a tensor for argument '") + name + "'"
                                   : std::string("a workspace"), sizes,
                          c10::typeMetaToScalarType(options.dtype()), options.device(),
                          e.what_without_backtrace());
    }
}

// `t` converted to `type` and made contiguous (argument `name` when `input`, else a result
// sized by argument `name`).
static at::Tensor copy_as(const char* op, const char* name, const at::Tensor& t,
                          at::ScalarType type, bool input) {
    try {
        return (t.scalar_type() == type ? t : t.to(type)).contiguous();
    } catch (const c10::Error& e) {
        const std::string what = input ? std::string("a contiguous ") + c10::toString(type) +
                                             " copy of argument '" + name + "'"
                                       : std::string("a tensor for argument '") + name + "'";
        allocation_failed(op, what, t.sizes(), type, t.device(), e.what_without_backtrace());
    }
}

at::Tensor contiguous(const char* op, const char* name, const at::Tensor& t) {
    if (t.is_contiguous()) return t;
    return copy_as(op, name, t, t.scalar_type(), true);
}

at::Tensor to_compute_dtype(const char* op, const char* name, const at::Tensor& t) {
    const auto type = t.scalar_type();
    if (type == at::kHalf || type == at::kBFloat16) return copy_as(op, name, t, at::kFloat, true);
    return contiguous(op, name, t);
}

at::Tensor to_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType type) {
    if (t.scalar_type() == type) return t;
    return copy_as(op, name, t, type, false);
}

at::Tensor to_dist_dtype(const char* op, const char* name, const at::Tensor& t,
                         at::ScalarType type) {
    if (type == at::kHalf || type == at::kBFloat16) {
        // the largest finite float16 (65504) and bfloat16 (0x7f7f: 3.3895313892515355e38),
        // both exact in float32
        const double top = type == at::kHalf ? 65504.0 : 3.3895313892515355e38;
        t.masked_fill_(t.gt(top).logical_and_(t.lt(std::numeric_limits<double>::infinity())),
                       top);
    }
    return to_dtype(op, name, t, type);
}

pcops_dtype to_pcops_dtype(at::ScalarType type) {
    switch (type) {
        case at::kFloat: return PCOPS_FLOAT32;
        case at::kDouble: return PCOPS_FLOAT64;
        case at::kHalf: return PCOPS_FLOAT16;
        case at::kBFloat16: return PCOPS_BFLOAT16;
        default: TORCH_CHECK_TYPE(false, "pcops: unsupported dtype ", c10::toString(type));
    }
}

void check_status(const char* op, pcops_status status) {
    TORCH_CHECK(status == PCOPS_SUCCESS, "pcops.", op, ": kernel failed: ",
                pcops_status_string(status));
}

const char* check_path(const char* op, const char* table, int64_t path, bool cuda,
                       pcops_dtype dtype) {
    int count = 0;
    const pcops_path_info* rows = pcops_path_table(table, &count);
    TORCH_INTERNAL_ASSERT(rows != nullptr, "no path table named ", table);
    const int device = cuda ? PCOPS_ON_CUDA : PCOPS_ON_CPU;
    std::string here;  // the paths of this device and dtype, for the message
    const pcops_path_info* found = nullptr;
    for (int i = 0; i < count; ++i) {
        const bool runs = (rows[i].devices & device) && (rows[i].dtypes & (1 << dtype));
        if (runs) here += std::string(here.empty() ? "" : ", ") + rows[i].name;
        if (rows[i].id == path) found = &rows[i];
    }
    const char* dtype_name = dtype == PCOPS_FLOAT64 ? "float64" : "float32";
    TORCH_CHECK_VALUE(found != nullptr, "pcops.", op, ": argument 'path' must be a path id of ",
                      table, " (0 to ", count - 1, "), got ", path);
    TORCH_CHECK_VALUE((found->devices & device) && (found->dtypes & (1 << dtype)), "pcops.",
                      op, ": path '", found->name, "' does not run on ",
                      cuda ? "CUDA" : "the CPU", " for ", dtype_name,
                      " inputs (the paths that do: ", here, ")");
    return found->name;
}

void forced_path_refused(const char* op, const char* name, const std::string& sizes) {
    TORCH_CHECK_VALUE(false, "pcops.", op, ": path '", name, "' cannot take these inputs (",
                      sizes, ") on this device");
    TORCH_INTERNAL_ASSERT(false);
}

#ifdef PCOPS_WITH_CUDA
void check_cuda_tensor(const char* op, const char* name, const at::Tensor& t) {
    TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), "pcops.", op,
                      ": all tensor arguments must be on one device, but '", name, "' is ",
                      describe(t), " while another argument is on CUDA");
}

void check_cuda(const char* op, cudaError_t err) {
    TORCH_CHECK(err == cudaSuccess, "pcops.", op, ": CUDA error: ", cudaGetErrorString(err));
}
#endif

}  // namespace pcops
