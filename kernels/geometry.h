/*
 * geometry.h -- the geometry core shared by the C (.c, .inc) and the CUDA (.cu) kernels.
 * Not part of the public C API (kernels/pcops.h); no torch, no allocation, no globals.
 *
 * What lives here, top to bottom:
 *   1. PCOPS_HD and the no-contraction guarantee for the C compilers.
 *   2. pcops_dist2_{f32,f64} / pcops_dist2_xy_{f32,f64}: THE squared distance. Every kernel
 *      that compares distances calls these, so the CPU and CUDA choose the same points. The
 *      overflow rule: pcops_staged_x_*, pcops_dist2_sat_*, pcops_dist2_checked_*.
 *   3. The (dist2, idx) key: its order, and the float32 packing into one uint64.
 *   4. Bounded selection lists on (dist2, idx): a max-heap and a sorted list, host and device.
 *   5. Valid lengths (lengths[b] clamped to [0, N]) and x mod L.
 *   6. Workspace carving with one alignment (PCOPS_WORKSPACE_ALIGN) for every op.
 *   7. CUDA only: the tail that closes every launcher (PCOPS_DEBUG_SYNC) and the float/double
 *      dtype switch of the extern "C" launchers.
 *
 * How to use it (for every kernel file):
 *   - #include "geometry.h" (it includes nothing from torch; the C files include cpu.h, which
 *     includes it).
 *   - Distances: d = pcops_dist2_f32(ax, ay, az, bx, by, bz) (or _f64, or _xy_ for circle NMS)
 *     instead of writing dx*dx + dy*dy + dz*dz. The build passes no -fmad=false or
 *     -ffp-contract=off: these functions are the only guarantee, so every kernel calls them.
 *     (a - b) and (b - a) give the same bits, so the argument order is free.
 *   - Keys: pcops_key_greater_{f32,f64}(da, ia, db, ib) is the order; pcops_key_pack_f32 /
 *     pcops_key_dist_f32 / pcops_key_index pack a float32 entry into one uint64 whose integer
 *     order is the key order (dist2 >= +0, idx in [0, 2**32)); pcops_key_unpack_f32 turns a
 *     run of them back into (dist2, idx) rows.
 *   - Heaps / lists: pcops_heap_push_<suffix>, pcops_heap_replace_top_<suffix>,
 *     pcops_heap_keep_<suffix> (push until full, then replace the root),
 *     pcops_heap_sort_<suffix>, pcops_sorted_insert_<suffix>, for suffix f32 / f64 (pairs of
 *     arrays T dist[], int64_t idx[]), f64_i32 (double dist[], int32_t idx[]) and u64 (packed
 *     keys). Every heap function takes a `stride` (entry j lives at [j * stride]): 1 for a
 *     contiguous row, blockDim.x for heaps interleaved by thread in shared memory. Other
 *     (T, index type) pairs: PCOPS_DEFINE_PAIR_LIST(suffix, T, I) here, beside these.
 *   - Workspaces: describe the layout ONCE in a function that carves from a pcops_carver, and
 *     call it with base NULL from pcops_<op>_workspace_bytes (it then only counts) and with the
 *     real base from the launcher; see group.cu (backward_layout) for an example.
 *   - .cu launchers end with `return pcops_launch_tail(err, stream);` and dispatch float/double
 *     with `return pcops_dispatch_float(dtype, stream, [&](auto zero) { using T =
 *     decltype(zero); return launch<T>(...); });`.
 */
#ifndef PCOPS_GEOMETRY_H
#define PCOPS_GEOMETRY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pcops.h"

/* ------------------------------------------------------------------------------------------
 * 1. Host/device functions, and no FMA contraction in C.
 *
 * A compiler may "contract" x*y + z into one fused multiply-add, rounding once instead of
 * twice; the CPU and CUDA then disagree in the last bit and can choose different neighbours.
 * The functions below are written so that no compiler contracts them:
 *   - CUDA device code: every operation is an explicitly rounded intrinsic (__fmul_rn,
 *     __fadd_rn, ...), which nvcc never contracts, whatever -fmad says.
 *   - C with GCC: each product and sum is its own statement, and GCC does not contract at all
 *     in ISO C modes (-std=c11/c17: the default there is -ffp-contract=off). GNU modes
 *     (-std=gnu11, GCC's default) contract freely, so they are refused below with #error
 *     (__STRICT_ANSI__ tells the two apart). Checked with GCC 12 -O3 -mavx2 -mfma:
 *     no vfmadd in ISO C, eight in gnu11.
 *   - C and C++ with clang: `#pragma STDC FP_CONTRACT OFF` (honoured by clang; its default,
 *     "on", would also only fuse within one expression, and the products are statements).
 *   - C++ with GCC (g++ contracts even in -std=c++17), i.e. the host half of a .cu file or a
 *     CPU kernel built as C++: each product goes through an empty asm statement that keeps it
 *     in a register, so GCC cannot see the multiply when it meets the add (PCOPS_ROUNDED).
 *     That also stops vectorisation, so hot CPU loops belong in C files. (In C, and with
 *     clang, PCOPS_ROUNDED is empty and the loops vectorise.)
 *   - -ffast-math (__FAST_MATH__) would break this and the +inf/NaN rules: refused.
 *   What no header can see: an explicit -ffp-contract=fast on the command line (GCC ISO C,
 *   clang). Do not pass it; the bitwise CPU/CUDA tests (pytest, lab/) would catch it.
 * ---------------------------------------------------------------------------------------- */
#if defined(__CUDACC__)
#define PCOPS_HD static __host__ __device__ __forceinline__
#else
#define PCOPS_HD static inline
#endif

#if defined(__FAST_MATH__)
#error "pcops kernels: -ffast-math breaks the bitwise CPU/CUDA agreement and the inf/NaN rules"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
#if defined(__GNUC__) && !defined(__clang__) && !defined(__cplusplus) && !defined(__STRICT_ANSI__)
#error "pcops kernels: compile C with -std=c11 (GCC contracts a*b+c into FMAs in GNU C modes)"
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__cplusplus) && \
    (defined(__x86_64__) || defined(__i386__))
#define PCOPS_ROUNDED(x) __asm__("" : "+x"(x))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__cplusplus) && defined(__aarch64__)
#define PCOPS_ROUNDED(x) __asm__("" : "+w"(x))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__cplusplus)
#define PCOPS_ROUNDED(x) __asm__("" : "+m"(x))
#else
#define PCOPS_ROUNDED(x) ((void)0)
#endif

/* ------------------------------------------------------------------------------------------
 * 2. Squared distances: dx*dx + dy*dy + dz*dz, left to right, every product and sum rounded
 *    to nearest on its own (no FMA). +inf for overflow, NaN for non-finite inputs, as IEEE
 *    says. Built from two rounded operations per type: the intrinsics on the device, plain
 *    operators on the host (each product kept from contraction by section 1).
 *
 *    The overflow rule (what the searches report). +inf means an empty slot, so two points
 *    with finite coordinates never get it: where their sum overflows (points about 1.8e19
 *    apart in float32, 1.3e154 in float64, or differences that overflow) the distance
 *    is the type's largest finite value PCOPS_DIST2_MAX_<SUF> (FLT_MAX, DBL_MAX); such refs tie
 *    there and are ordered by index like every other tie. A point with a non-finite
 *    coordinate is never a neighbour. The searches get this cheaply, in two steps:
 *      - a point is staged ONCE where it is loaded (a tile, a copy, a register):
 *        pcops_staged_x_SUF(x, y, z) is x, or NaN when a coordinate is not finite, so every
 *        distance to it is NaN, which no selection takes (comparisons with NaN are false);
 *      - each distance then only saturates: pcops_dist2_sat_SUF(d) = (MAX < d) ? MAX : d,
 *        which keeps NaN (one compare and a select, or one min.NaN on sm_80+).
 *    Paths whose points are all finite (the grids bin only finite refs and skip non-finite
 *    queries) need only the saturation. pcops_dist2_checked_SUF is the rule in one call, for
 *    ops that compute a few distances of given pairs (neighbor_dist2).
 * ---------------------------------------------------------------------------------------- */
#if defined(__CUDA_ARCH__)
PCOPS_HD float pcops_mul_f32(float a, float b) { return __fmul_rn(a, b); }
PCOPS_HD float pcops_add_f32(float a, float b) { return __fadd_rn(a, b); }
PCOPS_HD double pcops_mul_f64(double a, double b) { return __dmul_rn(a, b); }
PCOPS_HD double pcops_add_f64(double a, double b) { return __dadd_rn(a, b); }
#else
#define PCOPS_DEFINE_HOST_OPS(SUF, T)                                                          \
    PCOPS_HD T pcops_mul_##SUF(T a, T b) {                                                     \
        T product = a * b;                                                                     \
        PCOPS_ROUNDED(product);                                                                \
        return product;                                                                        \
    }                                                                                          \
    PCOPS_HD T pcops_add_##SUF(T a, T b) { return a + b; }
PCOPS_DEFINE_HOST_OPS(f32, float)
PCOPS_DEFINE_HOST_OPS(f64, double)
#undef PCOPS_DEFINE_HOST_OPS
#endif

/* pcops_dist2_SUF(a, b) for 3-D points and pcops_dist2_xy_SUF(a, b) in the xy plane (circle
 * NMS), SUF = f32 / f64. A subtraction is exact in sign, so (a - b) and (b - a) give the
 * same bits: the argument order is free. */
#define PCOPS_DEFINE_DIST2(SUF, T)                                                             \
    PCOPS_HD T pcops_dist2_##SUF(T ax, T ay, T az, T bx, T by, T bz) {                         \
        const T dx = ax - bx, dy = ay - by, dz = az - bz;                                      \
        const T xy = pcops_add_##SUF(pcops_mul_##SUF(dx, dx), pcops_mul_##SUF(dy, dy));        \
        return pcops_add_##SUF(xy, pcops_mul_##SUF(dz, dz));                                   \
    }                                                                                          \
    PCOPS_HD T pcops_dist2_xy_##SUF(T ax, T ay, T bx, T by) {                                  \
        const T dx = ax - bx, dy = ay - by;                                                    \
        return pcops_add_##SUF(pcops_mul_##SUF(dx, dx), pcops_mul_##SUF(dy, dy));             \
    }
PCOPS_DEFINE_DIST2(f32, float)
PCOPS_DEFINE_DIST2(f64, double)
#undef PCOPS_DEFINE_DIST2

/* The largest finite float32 / float64 (FLT_MAX, DBL_MAX, spelled out: no <float.h> needed). */
#define PCOPS_DIST2_MAX_f32 3.40282346638528859812e+38f
#define PCOPS_DIST2_MAX_f64 1.79769313486231570815e+308

/* The saturation of a distance d >= +0 or NaN: MAX for +inf, NaN stays NaN (MAX < NaN is
 * false). On sm_80+ one min.NaN.f32 (NaN if either operand is). */
PCOPS_HD float pcops_dist2_sat_f32(float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(d), "f"(PCOPS_DIST2_MAX_f32));
    return r;
#else
    return PCOPS_DIST2_MAX_f32 < d ? PCOPS_DIST2_MAX_f32 : d;
#endif
}
PCOPS_HD double pcops_dist2_sat_f64(double d) {
    return PCOPS_DIST2_MAX_f64 < d ? PCOPS_DIST2_MAX_f64 : d;
}

/* pcops_staged_x_SUF(x, y, z): the x coordinate of a point as the searches stage it: x when
 * the three coordinates are finite, else NaN (every distance to the point is then NaN: never a
 * neighbour, and never saturated). |v| <= MAX is false for +-inf and NaN. Branch-free, so
 * that copy loops vectorise. pcops_dist2_checked_SUF(a, b): the rule for one pair, looking at
 * the coordinates (a non-finite point keeps IEEE's +inf or NaN). */
#define PCOPS_DEFINE_STAGED(SUF, T)                                                            \
    PCOPS_HD T pcops_staged_x_##SUF(T x, T y, T z) {                                           \
        const T ax = x < 0 ? -x : x, ay = y < 0 ? -y : y, az = z < 0 ? -z : z;                 \
        return (ax <= PCOPS_DIST2_MAX_##SUF) & (ay <= PCOPS_DIST2_MAX_##SUF) &                 \
                       (az <= PCOPS_DIST2_MAX_##SUF)                                           \
                   ? x                                                                         \
                   : (T)NAN;                                                                   \
    }                                                                                          \
    PCOPS_HD T pcops_dist2_checked_##SUF(T ax, T ay, T az, T bx, T by, T bz) {                 \
        const T d = pcops_dist2_##SUF(ax, ay, az, bx, by, bz);                                 \
        const int finite = pcops_staged_x_##SUF(ax, ay, az) == ax &&                           \
                           pcops_staged_x_##SUF(bx, by, bz) == bx;                             \
        return finite ? pcops_dist2_sat_##SUF(d) : d;                                          \
    }                                                                                          \
    /* The pruning limit of a selection whose current k-th distance is th: a lower bound   */  \
    /* above it rules a ref out, except when th is the saturated maximum, which a ref of   */  \
    /* lower index at any larger true distance still ties (then +inf: nothing is pruned).  */  \
    PCOPS_HD double pcops_prune_limit_##SUF(T th) {                                            \
        return th < PCOPS_DIST2_MAX_##SUF ? (double)th : (double)INFINITY;                     \
    }
#if defined(__CUDA_ARCH__)
/* device, float64: on the high words only (32-bit operations; the compares and the 64-bit
 * select of the generic form cost registers): a non-finite coordinate has the exponent all
 * ones, and setting the top mantissa bit of x's makes it a NaN */
#define pcops_staged_x_f64 pcops_staged_x_f64_generic
#endif
PCOPS_DEFINE_STAGED(f32, float)
PCOPS_DEFINE_STAGED(f64, double)
#undef PCOPS_DEFINE_STAGED
#if defined(__CUDA_ARCH__)
#undef pcops_staged_x_f64
PCOPS_HD double pcops_staged_x_f64(double x, double y, double z) {
    const int e = 0x7ff00000, hx = __double2hiint(x);
    const int bad =
        ((hx & e) == e) | ((__double2hiint(y) & e) == e) | ((__double2hiint(z) & e) == e);
    return __hiloint2double(hx | (bad ? 0x7ff80000 : 0), __double2loint(x));
}
#endif

/* ------------------------------------------------------------------------------------------
 * 3. The key (dist2, idx): ordered by dist2, ties to the lower idx. Selection (kNN, FPS's
 *    arg-max, NMS) is defined on this order, so every path returns the same indices. NaN
 *    distances never enter a selection (callers test `d < threshold` first).
 *
 *    float32 packing: key = (bits of dist2) << 32 | idx. For dist2 >= +0 (not NaN, +inf
 *    allowed) the float bits order like the values, so the integer order of the keys is the
 *    key order: one compare instead of two and a tie test. idx must be in [0, 2**32).
 * ---------------------------------------------------------------------------------------- */
PCOPS_HD int pcops_key_greater_f32(float da, int64_t ia, float db, int64_t ib) {
    return da > db || (da == db && ia > ib);
}

PCOPS_HD int pcops_key_greater_f64(double da, int64_t ia, double db, int64_t ib) {
    return da > db || (da == db && ia > ib);
}

PCOPS_HD uint32_t pcops_float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

PCOPS_HD float pcops_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

PCOPS_HD uint64_t pcops_key_pack_f32(float dist2, int64_t idx) {
    return (uint64_t)pcops_float_bits(dist2) << 32 | (uint64_t)(uint32_t)idx;
}

PCOPS_HD float pcops_key_dist_f32(uint64_t key) { return pcops_bits_float((uint32_t)(key >> 32)); }

PCOPS_HD int64_t pcops_key_index(uint64_t key) { return (int64_t)(key & 0xffffffffu); }

/* ------------------------------------------------------------------------------------------
 * 4. Bounded selection of the smallest keys: a max-heap (the root is the largest kept key,
 *    the threshold a new entry must beat) and a sorted list (for small caps). Entry j lives at
 *    [j * stride]. Typical use, visiting candidates n in ascending order:
 *
 *        if (count < cap || pcops_key_greater_f32(d[0], i[0], dn, n))
 *            if (pcops_heap_keep_f32(d, i, 1, cap, &count, dn, n)) threshold = d[0];
 *        ...
 *        pcops_heap_sort_f32(d, i, 1, count);  // ascending by key
 *
 *    (pcops_heap_keep pushes while count < cap, then replaces the root; it returns 1 once the
 *    heap is full, when the root is the threshold.) The packed (u64) versions compare keys as
 *    integers; pcops_key_unpack_f32 turns a sorted packed heap into (dist2, idx) rows. All are
 *    O(log cap) per entry, loop over the heap in place, and use no memory beyond the arrays
 *    given. A sift step reads each entry it compares once, into locals, and compares those:
 *    the arrays may alias, so re-reading d[c * stride] in every compare keeps the loads in
 *    the loop, and the float64 heap kernels then spill inside their walk.
 * ---------------------------------------------------------------------------------------- */

/* Defines pcops_heap_push_SUF, pcops_heap_replace_top_SUF, pcops_heap_keep_SUF,
 * pcops_heap_sort_SUF and pcops_sorted_insert_SUF for entries (T dist, I idx) held in two arrays. */
#define PCOPS_DEFINE_PAIR_LIST(SUF, T, I)                                                      \
    /* Adds (dn, n) as entry `count` of a max-heap and sifts it up. */                         \
    PCOPS_HD void pcops_heap_push_##SUF(T* d, I* i, int64_t stride, int64_t count, T dn,      \
                                        int64_t n) {                                          \
        int64_t j = count;                                                                     \
        while (j > 0) {                                                                        \
            const int64_t p = (j - 1) / 2;                                                     \
            const T dp = d[p * stride];                                                        \
            const I ip = i[p * stride];                                                        \
            if (!(dn > dp || (dn == dp && n > (int64_t)ip))) break;                            \
            d[j * stride] = dp;                                                                \
            i[j * stride] = ip;                                                                \
            j = p;                                                                             \
        }                                                                                      \
        d[j * stride] = dn;                                                                    \
        i[j * stride] = (I)n;                                                                  \
    }                                                                                          \
    /* Puts (dn, n) into the hole at entry j of a max-heap of `count` entries, sifting down; */ \
    /* with j = 0 it replaces the root (the largest key). */                                   \
    PCOPS_HD void pcops_heap_sift_down_##SUF(T* d, I* i, int64_t stride, int64_t count,       \
                                             int64_t j, T dn, int64_t n) {                    \
        for (;;) {                                                                             \
            int64_t c = 2 * j + 1;                                                             \
            if (c >= count) break;                                                             \
            T dc = d[c * stride];                                                              \
            I ic = i[c * stride];                                                              \
            if (c + 1 < count) {                                                               \
                const T dr = d[(c + 1) * stride];                                              \
                const I ir = i[(c + 1) * stride];                                              \
                if (dr > dc || (dr == dc && ir > ic)) {                                        \
                    ++c;                                                                       \
                    dc = dr;                                                                   \
                    ic = ir;                                                                   \
                }                                                                              \
            }                                                                                  \
            if (!(dc > dn || (dc == dn && (int64_t)ic > n))) break;                            \
            d[j * stride] = dc;                                                                \
            i[j * stride] = ic;                                                                \
            j = c;                                                                             \
        }                                                                                      \
        d[j * stride] = dn;                                                                    \
        i[j * stride] = (I)n;                                                                  \
    }                                                                                          \
    PCOPS_HD void pcops_heap_replace_top_##SUF(T* d, I* i, int64_t stride, int64_t count,     \
                                               T dn, int64_t n) {                             \
        pcops_heap_sift_down_##SUF(d, i, stride, count, 0, dn, n);                             \
    }                                                                                          \
    /* A heap of at most cap entries, *count so far, takes (dn, n): pushed while there is     */ \
    /* room, else in place of the root (the caller has checked that it is below the root).   */ \
    /* Returns 1 when the heap is full after it, i.e. the root is the new threshold.          */ \
    PCOPS_HD int pcops_heap_keep_##SUF(T* d, I* i, int64_t stride, int64_t cap, int64_t* count,\
                                       T dn, int64_t n) {                                     \
        if (*count < cap) {                                                                    \
            pcops_heap_push_##SUF(d, i, stride, *count, dn, n);                                \
            return ++*count == cap;                                                            \
        }                                                                                      \
        pcops_heap_replace_top_##SUF(d, i, stride, cap, dn, n);                                \
        return 1;                                                                              \
    }                                                                                          \
    /* Heapsort: the max-heap [0, count) becomes ascending by key, in place. */                \
    PCOPS_HD void pcops_heap_sort_##SUF(T* d, I* i, int64_t stride, int64_t count) {          \
        for (int64_t end = count - 1; end > 0; --end) {                                        \
            const T dl = d[end * stride];                                                      \
            const int64_t nl = (int64_t)i[end * stride];                                       \
            d[end * stride] = d[0];                                                            \
            i[end * stride] = i[0];                                                            \
            pcops_heap_sift_down_##SUF(d, i, stride, end, 0, dl, nl);                          \
        }                                                                                      \
    }                                                                                          \
    /* A list of `cap` entries sorted ascending by key: inserts (dn, n), given that it is     */ \
    /* below the last entry, which drops out. n must exceed every index in the list (refs    */ \
    /* visited in ascending order), so it goes after the entries of equal distance.          */ \
    PCOPS_HD void pcops_sorted_insert_##SUF(T* d, I* i, int64_t cap, T dn, int64_t n) {       \
        int64_t pos = cap - 1;                                                                 \
        while (pos > 0 && d[pos - 1] > dn) {                                                   \
            d[pos] = d[pos - 1];                                                               \
            i[pos] = i[pos - 1];                                                               \
            --pos;                                                                             \
        }                                                                                      \
        d[pos] = dn;                                                                           \
        i[pos] = (I)n;                                                                         \
    }

PCOPS_DEFINE_PAIR_LIST(f32, float, int64_t)
PCOPS_DEFINE_PAIR_LIST(f64, double, int64_t)
/* int32 indices: the float64 heaps of knn.cu in shared memory (12 bytes an entry, not 16). */
PCOPS_DEFINE_PAIR_LIST(f64_i32, double, int32_t)

/* The same max-heap on packed float32 keys (pcops_key_pack_f32). */
PCOPS_HD void pcops_heap_push_u64(uint64_t* h, int64_t stride, int64_t count, uint64_t key) {
    int64_t j = count;
    while (j > 0) {
        const int64_t p = (j - 1) / 2;
        if (h[p * stride] >= key) break;
        h[j * stride] = h[p * stride];
        j = p;
    }
    h[j * stride] = key;
}

PCOPS_HD void pcops_heap_sift_down_u64(uint64_t* h, int64_t stride, int64_t count, int64_t j,
                                       uint64_t key) {
    for (;;) {
        int64_t c = 2 * j + 1;
        if (c >= count) break;
        uint64_t kc = h[c * stride];
        if (c + 1 < count) {
            const uint64_t kr = h[(c + 1) * stride];
            /* branch-free child choice. The device selects c (SEL): c += right would put an add
             * and a carry on the path to the next level's load. The host adds: GCC turns the
             * select form into a branch on the compare (unpredictable), the add into setb + cmov. */
            const int right = kr > kc;
            kc = right ? kr : kc;
#if defined(__CUDA_ARCH__)
            c = right ? c + 1 : c;
#else
            c += right;
#endif
        }
        if (kc <= key) break;
        h[j * stride] = kc;
        j = c;
    }
    h[j * stride] = key;
}

PCOPS_HD void pcops_heap_replace_top_u64(uint64_t* h, int64_t stride, int64_t count,
                                         uint64_t key) {
    pcops_heap_sift_down_u64(h, stride, count, 0, key);
}

PCOPS_HD void pcops_heap_sort_u64(uint64_t* h, int64_t stride, int64_t count) {
    for (int64_t end = count - 1; end > 0; --end) {
        const uint64_t key = h[end * stride];
        h[end * stride] = h[0];
        pcops_heap_sift_down_u64(h, stride, end, 0, key);
    }
}

PCOPS_HD int pcops_heap_keep_u64(uint64_t* h, int64_t stride, int64_t cap, int64_t* count,
                                 uint64_t key) {
    if (*count < cap) {
        pcops_heap_push_u64(h, stride, *count, key);
        return ++*count == cap;
    }
    pcops_heap_replace_top_u64(h, stride, cap, key);
    return 1;
}

/* Unpacks the keys h[j * stride], j in [0, count), into dist[j], idx[j]. h may be idx itself
 * (stride 1: a float32 heap kept in its output idx row): entry j is read before slot j is
 * written, and int64_t and uint64_t may alias. */
PCOPS_HD void pcops_key_unpack_f32(const uint64_t* h, int64_t stride, int64_t count,
                                   float* dist, int64_t* idx) {
    for (int64_t j = 0; j < count; ++j) {
        const uint64_t key = h[j * stride];
        dist[j] = pcops_key_dist_f32(key);
        idx[j] = pcops_key_index(key);
    }
}

/* ------------------------------------------------------------------------------------------
 * 5. Valid lengths. A cloud b of a padded batch holds pcops_valid_length(lengths, b, N)
 *    points: lengths[b] clamped to [0, N], or N without lengths (NULL). Kernels clamp, so
 *    they never read out of bounds whatever the values; checking the values is the caller's.
 * ---------------------------------------------------------------------------------------- */
PCOPS_HD int64_t pcops_valid_length(const int64_t* lengths, int64_t b, int64_t N) {
    if (lengths == 0) return N;
    const int64_t L = lengths[b];
    return L < 0 ? 0 : (L > N ? N : L);
}

/* x mod L in [0, L) for any sign of x; L > 0 (FPS's start index). */
PCOPS_HD int64_t pcops_positive_mod(int64_t x, int64_t L) {
    const int64_t r = x % L;
    return r < 0 ? r + L : r;
}

/* ------------------------------------------------------------------------------------------
 * 6. Workspace carving. One layout function per op carves its buffers, in order, from a
 *    pcops_carver; each piece starts PCOPS_WORKSPACE_ALIGN bytes after a multiple of it
 *    (relative to the base: callers pass a base aligned at least that much -- torch's CUDA
 *    allocator gives 512; on the CPU 64 is plenty for the loops there). With base NULL the
 *    carver only counts, so pcops_<op>_workspace_bytes and the launcher run the same code:
 *
 *        static void layout(pcops_carver* w, int64_t n, float** a, int64_t** b) {
 *            *a = (float*)pcops_carve(w, n, sizeof(float));
 *            *b = (int64_t*)pcops_carve(w, n, sizeof(int64_t));
 *        }
 *        size_t op_workspace_bytes(n): pcops_carver w = pcops_carver_init(NULL);
 *                                      layout(&w, n, &a, &b); return pcops_carver_bytes(&w);
 *        launcher:                     pcops_carver w = pcops_carver_init(workspace); ...
 *
 *    Sizes saturate: a count < 0 or a size past SIZE_MAX makes the total SIZE_MAX (which no
 *    allocation satisfies, so the caller's size check fails cleanly) and the pieces NULL.
 * ---------------------------------------------------------------------------------------- */
#define PCOPS_WORKSPACE_ALIGN ((size_t)256)

typedef struct pcops_carver {
    char* base;  /* NULL: count only */
    size_t used; /* bytes so far, a multiple of PCOPS_WORKSPACE_ALIGN, or SIZE_MAX */
} pcops_carver;

PCOPS_HD pcops_carver pcops_carver_init(void* base) {
    pcops_carver w;
    w.base = (char*)base;
    w.used = 0;
    return w;
}

/* Bytes rounded up to the alignment (SIZE_MAX if that overflows). */
PCOPS_HD size_t pcops_align_up(size_t bytes) {
    if (bytes > SIZE_MAX - (PCOPS_WORKSPACE_ALIGN - 1)) return SIZE_MAX;
    return (bytes + PCOPS_WORKSPACE_ALIGN - 1) / PCOPS_WORKSPACE_ALIGN * PCOPS_WORKSPACE_ALIGN;
}

/* The next piece of `count` elements of `elem_bytes` (NULL when only counting). */
PCOPS_HD void* pcops_carve(pcops_carver* w, int64_t count, size_t elem_bytes) {
    if (w->used == SIZE_MAX) return 0;
    if (count < 0 || (elem_bytes > 0 && (uint64_t)count > SIZE_MAX / elem_bytes)) {
        w->used = SIZE_MAX;
        return 0;
    }
    const size_t bytes = pcops_align_up((size_t)count * elem_bytes);
    if (bytes == SIZE_MAX || bytes > SIZE_MAX - w->used) {
        w->used = SIZE_MAX;
        return 0;
    }
    void* piece = w->base ? (void*)(w->base + w->used) : 0;
    w->used += bytes;
    return piece;
}

PCOPS_HD size_t pcops_carver_bytes(const pcops_carver* w) { return w->used; }

/* ------------------------------------------------------------------------------------------
 * 7. CUDA launchers (C++ only): every extern "C" launcher ends with pcops_launch_tail, which
 *    with PCOPS_DEBUG_SYNC (setup.py DEBUG=1, make DEBUG=1) waits for the stream so that an
 *    asynchronous fault is reported by the launcher that caused it. pcops_dispatch_float
 *    calls launch(float{}) or launch(double{}) by dtype (cudaErrorInvalidValue for others)
 *    and applies the tail.
 * ---------------------------------------------------------------------------------------- */
#if defined(__CUDACC__) && defined(__cplusplus)
static inline cudaError_t pcops_launch_tail(cudaError_t err, cudaStream_t stream) {
#ifdef PCOPS_DEBUG_SYNC
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
#else
    (void)stream;
#endif
    return err;
}

template <typename Launch>
static inline cudaError_t pcops_dispatch_float(pcops_dtype dtype, cudaStream_t stream,
                                               Launch&& launch) {
    cudaError_t err;
    switch (dtype) {
        case PCOPS_FLOAT32: err = launch(float{}); break;
        case PCOPS_FLOAT64: err = launch(double{}); break;
        default: return cudaErrorInvalidValue;
    }
    return pcops_launch_tail(err, stream);
}

/* Blocks of `threads` for a grid-stride loop over `items`: one per `threads` items, at most 16
 * per SM of the current device (132 SMs assumed when the device cannot be queried; the error
 * is cleared so that the launch check after this does not see it). */
static inline unsigned pcops_grid_stride_blocks(int64_t items, int threads) {
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        sms = 132;
    }
    const int64_t blocks = (items + threads - 1) / threads;
    const int64_t cap = (int64_t)sms * 16;
    return (unsigned)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}
#endif

#endif /* PCOPS_GEOMETRY_H */
