/*
 * knn_nd.h -- the distances of kNN in any dimension (kernels/knn_nd.c, kernels/knn_nd.cu),
 * shared by the C and CUDA kernels so that both compute every distance in the same order, with
 * the same roundings (kernels/README.md, "kNN in any dimension", says why this order).
 *
 * A distance is a sum over the coordinates d = 0 .. D-1, in that order, from +0; each step is
 * one of the functions below, each operation rounded on its own (geometry.h's pcops_mul /
 * pcops_add: no FMA on either device):
 *   L2:     acc = acc + (a_d - b_d) * (a_d - b_d). From +0, D = 3 gives the bits of
 *           pcops_dist2 ((+0 + x) is x for every x >= +0).
 *   L1:     acc = acc + |a_d - b_d|.
 *   COSINE: three sums, dot = sum a_d * b_d, na = sum a_d * a_d, nb = sum b_d * b_d, then
 *           knn_nd_cosine(dot, na, nb).
 * Not part of the public C API.
 */
#ifndef PCOPS_KNN_ND_H
#define PCOPS_KNN_ND_H

#include "geometry.h"

#if !defined(__CUDA_ARCH__)
#include <math.h>
#endif

#define PCOPS_DEFINE_KNN_ND_STEPS(SUF, T)                                                      \
    PCOPS_HD T knn_nd_l2_step_##SUF(T acc, T a, T b) {                                         \
        const T d = a - b;                                                                     \
        return pcops_add_##SUF(acc, pcops_mul_##SUF(d, d));                                    \
    }                                                                                          \
    PCOPS_HD T knn_nd_l1_step_##SUF(T acc, T a, T b) {                                         \
        const T d = a - b;                                                                     \
        return pcops_add_##SUF(acc, d < 0 ? -d : d);                                           \
    }                                                                                          \
    PCOPS_HD T knn_nd_dot_step_##SUF(T acc, T a, T b) {                                        \
        return pcops_add_##SUF(acc, pcops_mul_##SUF(a, b));                                    \
    }

PCOPS_DEFINE_KNN_ND_STEPS(f32, float)
PCOPS_DEFINE_KNN_ND_STEPS(f64, double)
#undef PCOPS_DEFINE_KNN_ND_STEPS

/* knn_nd_l2_SUF(a, b, D): the L2 distance of two points of D coordinates, the L2 steps from
 * +0 in coordinate order (FPS and ball query of any dimension, fps_nd.c, ball_query_nd.c). */
#define PCOPS_DEFINE_KNN_ND_L2(SUF, T)                                                         \
    PCOPS_HD T knn_nd_l2_##SUF(const T* a, const T* b, int64_t D) {                            \
        T acc = 0;                                                                             \
        for (int64_t d = 0; d < D; ++d) acc = knn_nd_l2_step_##SUF(acc, a[d], b[d]);           \
        return acc;                                                                            \
    }
PCOPS_DEFINE_KNN_ND_L2(f32, float)
PCOPS_DEFINE_KNN_ND_L2(f64, double)
#undef PCOPS_DEFINE_KNN_ND_L2

/* The cosine distance from the three sums: max(0, 1 - dot / (sqrt(na) * sqrt(nb))), every
 * operation correctly rounded (IEEE sqrt and division on the host, the _rn intrinsics on the
 * device); 1 when either norm is 0 (the direction of a zero vector is undefined: it is as far
 * as an orthogonal one, torch_cluster's and torch.cosine_similarity's convention up to their
 * eps). The clamp keeps rounding from giving a negative distance; NaN (non-finite inputs, or
 * sums that overflow to inf) stays NaN and is never a neighbour. */
#if defined(__CUDA_ARCH__)
PCOPS_HD float knn_nd_cosine_f32(float dot, float na, float nb) {
    if (na == 0.0f || nb == 0.0f) return 1.0f;
    const float c = __fdiv_rn(dot, __fmul_rn(__fsqrt_rn(na), __fsqrt_rn(nb)));
    const float d = __fsub_rn(1.0f, c);
    return d < 0.0f ? 0.0f : d;
}
PCOPS_HD double knn_nd_cosine_f64(double dot, double na, double nb) {
    if (na == 0.0 || nb == 0.0) return 1.0;
    const double c = __ddiv_rn(dot, __dmul_rn(__dsqrt_rn(na), __dsqrt_rn(nb)));
    const double d = __dsub_rn(1.0, c);
    return d < 0.0 ? 0.0 : d;
}
#else
PCOPS_HD float knn_nd_cosine_f32(float dot, float na, float nb) {
    if (na == 0.0f || nb == 0.0f) return 1.0f;
    const float c = dot / pcops_mul_f32(sqrtf(na), sqrtf(nb));
    const float d = 1.0f - c;
    return d < 0.0f ? 0.0f : d;
}
PCOPS_HD double knn_nd_cosine_f64(double dot, double na, double nb) {
    if (na == 0.0 || nb == 0.0) return 1.0;
    const double c = dot / pcops_mul_f64(sqrt(na), sqrt(nb));
    const double d = 1.0 - c;
    return d < 0.0 ? 0.0 : d;
}
#endif

/* The overflow rule of kernels/geometry.h for D coordinates: +inf means an empty slot, so a
 * pair of points whose coordinates are all finite never gets it (nor NaN): where its distance
 * is not <= the type's largest finite value MAX (an L2 / L1 sum that overflows; a cosine whose
 * norms overflow, giving NaN), it is MAX, where such refs tie in index order. A point with a
 * non-finite coordinate is never a neighbour. Its L2 / L1 distances are +inf or NaN already,
 * so those metrics look at the coordinates only for the rare distances that are not <= MAX;
 * its cosine ones may be finite (1 - dot / inf), so the cosine looks at every pair's flags.
 *   knn_nd_finite_SUF(p, D): every coordinate of p finite.
 *   knn_nd_ruled_SUF(d, finite): the distance d of a pair as the searches report it, given
 *   whether both points are finite: +inf (rejected by every `d < threshold`) for a pair that
 *   is not, d saturated at MAX for one that is. */
#define PCOPS_DEFINE_KNN_ND_RULE(SUF, T)                                                       \
    PCOPS_HD int knn_nd_finite_##SUF(const T* p, int64_t D) {                                  \
        int finite = 1;                                                                        \
        for (int64_t d = 0; d < D; ++d) {                                                      \
            const T a = p[d] < 0 ? -p[d] : p[d];                                               \
            finite &= a <= PCOPS_DIST2_MAX_##SUF;                                              \
        }                                                                                      \
        return finite;                                                                         \
    }                                                                                          \
    PCOPS_HD T knn_nd_ruled_##SUF(T d, int finite) {                                           \
        if (!finite) return (T)INFINITY;                                                       \
        return d <= PCOPS_DIST2_MAX_##SUF ? d : PCOPS_DIST2_MAX_##SUF;                         \
    }
PCOPS_DEFINE_KNN_ND_RULE(f32, float)
PCOPS_DEFINE_KNN_ND_RULE(f64, double)
#undef PCOPS_DEFINE_KNN_ND_RULE

#endif /* PCOPS_KNN_ND_H */
