/*
 * fps_layout.c -- the layout of a sorted batch vector that torch_cluster's fps needs, on the
 * CPU (see pcops.h, "FPS layout").
 *
 *   batch[N] int64 (sorted cloud ids) -> stats[6], left[N], slot[N] int64.
 *
 * One pass over the runs of equal ids (in a sorted vector, the clouds): a run [s, e) of id b
 * holds n = e - s points, its point i has left[i] = s and rank i - s, and it is sampled iff
 * rank < pcops_fps_samples(n) (and b < batch_size when batch_size >= 0). A second pass, once
 * the largest cloud L and so K = pcops_fps_samples(L) are known, writes slot[i] = b*K + rank
 * (the point's place in the [B, K] output of the FPS) or -1. Serial: O(N), no search.
 */
#include "cpu.h"
#include "fps_layout.h"

static pcops_status fps_layout(const int64_t* batch, int64_t N, double ratio, pcops_dtype dtype,
                               int64_t batch_size, int64_t* stats, int64_t* left, int64_t* slot);

pcops_status pcops_fps_layout_cpu(const int64_t* batch, int64_t N, double ratio,
                                  pcops_dtype dtype, int64_t batch_size, int64_t* stats,
                                  int64_t* left, int64_t* slot) {
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h: the samples per cloud in IEEE */
    const pcops_status status = fps_layout(batch, N, ratio, dtype, batch_size, stats, left, slot);
    pcops_fpmode_restore(fpmode);
    return status;
}

static pcops_status fps_layout(const int64_t* batch, int64_t N, double ratio, pcops_dtype dtype,
                               int64_t batch_size, int64_t* stats, int64_t* left, int64_t* slot) {
    if (N < 0 || !stats) return PCOPS_ERROR_INVALID_VALUE;
    for (int i = 0; i < PCOPS_FPS_LAYOUT_STATS; ++i) stats[i] = 0;
    if (N == 0) return PCOPS_SUCCESS;
    if (!batch || !left || !slot) return PCOPS_ERROR_INVALID_VALUE;
    int64_t problems = batch[0] < 0, L = 0, E = 0;
    for (int64_t s = 0, e; s < N; s = e) {
        const int64_t b = batch[s];
        for (e = s + 1; e < N && batch[e] == b; ++e) problems += batch[e] < batch[e - 1];
        if (e < N) problems += batch[e] < batch[e - 1];
        const int64_t n = e - s;
        const int64_t k =
            batch_size >= 0 && b >= batch_size ? 0 : pcops_fps_samples(n, ratio, dtype);
        L = n > L ? n : L;
        E += k;
        for (int64_t i = s; i < e; ++i) {
            left[i] = s;
            slot[i] = i - s < k ? i - s : -1;
        }
    }
    const int64_t K = pcops_fps_samples(L, ratio, dtype);
    for (int64_t i = 0; i < N; ++i)
        if (slot[i] >= 0) slot[i] += batch[i] * K;
    stats[PCOPS_FPS_LAYOUT_PROBLEMS] = problems;
    stats[PCOPS_FPS_LAYOUT_FIRST] = batch[0];
    stats[PCOPS_FPS_LAYOUT_LAST] = batch[N - 1];
    stats[PCOPS_FPS_LAYOUT_LARGEST] = L;
    stats[PCOPS_FPS_LAYOUT_SAMPLED] = E;
    stats[PCOPS_FPS_LAYOUT_SAMPLES_LARGEST] = K;
    return PCOPS_SUCCESS;
}
