/*
 * status.c -- status strings and dtype sizes of the C API (kernels/pcops.h).
 */
#include "pcops.h"

const char* pcops_status_string(pcops_status status) {
    switch (status) {
        case PCOPS_SUCCESS: return "success";
        case PCOPS_ERROR_INVALID_VALUE: return "invalid value (a negative size or a NULL pointer)";
        case PCOPS_ERROR_UNSUPPORTED_DTYPE: return "unsupported dtype";
    }
    return "unknown pcops_status";
}

size_t pcops_dtype_size(pcops_dtype dtype) {
    switch (dtype) {
        case PCOPS_FLOAT32: return 4;
        case PCOPS_FLOAT64: return 8;
        case PCOPS_FLOAT16: return 2;
        case PCOPS_BFLOAT16: return 2;
    }
    return 0;
}
