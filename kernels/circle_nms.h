/*
 * circle_nms.h -- what the CPU (circle_nms.c) and CUDA (circle_nms.cu) circle NMS share, so that
 * both visit the boxes in the same order. Not part of the public C API.
 *
 * The visiting order is ascending in the key below, ties (equal keys) to the lower box index:
 *   - a NaN score has key 0, below every number's key: NaN scores are visited first (the rule
 *     of torch.sort(descending=True), which the op followed when the bindings sorted);
 *   - -0.0 and +0.0 have the same key (they compare equal, so the lower index goes first);
 *   - otherwise a higher score has a lower key: the IEEE bits made monotone and inverted.
 * float32 scores use the low 32 bits; float64 scores all 64.
 */
#ifndef PCOPS_CIRCLE_NMS_H
#define PCOPS_CIRCLE_NMS_H

#include "geometry.h"

PCOPS_HD uint64_t pcops_nms_score_key_f32(float s) {
    if (s != s) return 0;
    if (s == 0.0f) s = 0.0f; /* -0.0 -> +0.0 */
    uint32_t b;
    memcpy(&b, &s, sizeof b);
    const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (uint64_t)(uint32_t)~ascending; /* >= 0x007fffff for -inf .. +inf: never 0 */
}

PCOPS_HD uint64_t pcops_nms_score_key_f64(double s) {
    if (s != s) return 0;
    if (s == 0.0) s = 0.0;
    uint64_t b;
    memcpy(&b, &s, sizeof b);
    const uint64_t ascending = (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
    return ~ascending;
}

#endif /* PCOPS_CIRCLE_NMS_H */
