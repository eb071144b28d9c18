/*
 * fps_layout.h -- the number of samples torch_cluster's fps takes from a cloud of n points,
 * shared by kernels/fps_layout.c and kernels/fps_layout.cu (PCOPS_HD: host and device).
 *
 * torch_cluster computes ceil(n * ratio) in the dtype of the points: n and ratio are rounded
 * to that dtype, their product is rounded to it, then the ceiling is taken (in float32
 * 50 * 0.3 is 15.000001 -> 16 samples). The product of two values of at most 24 significant
 * bits is exact in double, so rounding it once to the dtype gives the dtype's product.
 */
#ifndef PCOPS_FPS_LAYOUT_H
#define PCOPS_FPS_LAYOUT_H

#include <math.h>
#include <stdint.h>

#include "geometry.h"
#include "pcops.h"

/* x rounded to nearest, ties to even, to a binary format of p significant bits whose smallest
 * normal number is 2**emin and whose largest finite number is max (+inf above it). */
PCOPS_HD double pcops_round_to_format(double x, int p, int emin, double max) {
    if (x == 0.0 || !(x == x) || x - x != 0.0) return x; /* 0, NaN, inf */
    int e;
    frexp(fabs(x), &e); /* |x| in [2**(e-1), 2**e) */
    const int lowest = e - 1 > emin ? e - 1 : emin; /* the exponent of the spacing's binade */
    const double spacing = ldexp(1.0, lowest - p + 1);
    const double r = rint(x / spacing) * spacing;
    return fabs(r) > max ? (r > 0 ? INFINITY : -INFINITY) : r;
}

PCOPS_HD double pcops_round_to_dtype(double x, pcops_dtype dtype) {
    switch (dtype) {
        case PCOPS_FLOAT32: return pcops_round_to_format(x, 24, -126, 3.4028234663852886e38);
        case PCOPS_FLOAT16: return pcops_round_to_format(x, 11, -14, 65504.0);
        case PCOPS_BFLOAT16: return pcops_round_to_format(x, 8, -126, 3.3895313892515355e38);
        default: return x; /* float64 */
    }
}

/* ceil(n * ratio) in `dtype`, at most n (a rounded-up n, e.g. 2051 -> 2052 in float16, or an
 * infinite product, still samples each of the n points once at most); 0 for n <= 0. */
PCOPS_HD int64_t pcops_fps_samples(int64_t n, double ratio, pcops_dtype dtype) {
    if (n <= 0) return 0;
    const double product = pcops_round_to_dtype(
        pcops_round_to_dtype((double)n, dtype) * pcops_round_to_dtype(ratio, dtype), dtype);
    const double k = ceil(product);
    return k >= (double)n ? n : (k <= 0.0 ? 0 : (int64_t)k);
}

#endif /* PCOPS_FPS_LAYOUT_H */
