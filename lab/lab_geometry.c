/*
 * lab_geometry.c -- the host half of kernels/geometry.h against plain references: the bounded
 * max-heap and the sorted list keep exactly the K smallest (dist2, idx) keys (pairs and packed
 * float32 keys, contiguous and strided, pushed and replaced or through pcops_heap_keep; int32
 * indices), unpacking a packed row in place, the packed key order is the key order, and the
 * workspace carver aligns, counts and saturates. (The device half is exercised by every CUDA
 * kernel that includes the header, against the CPU, in the other lab programs and in pytest.)
 */
#include "lab.h"

enum { COUNT = 5000, K = 37, STRIDE = 3 };

/* The K smallest keys of (d, i = 0..COUNT-1), ascending: a selection over all of them. */
static void smallest_keys(const float* d, int64_t* want) {
    int64_t last = -1;
    for (int64_t j = 0; j < K; ++j) {
        int64_t best = -1;
        for (int64_t n = 0; n < COUNT; ++n) {
            if (last >= 0 && !pcops_key_greater_f32(d[n], n, d[last], last)) continue;
            if (best < 0 || pcops_key_greater_f32(d[best], best, d[n], n)) best = n;
        }
        want[j] = last = best;
    }
}

int main(int argc, char** argv) {
    lab_seed(argc, argv);
    float d[COUNT];
    for (int64_t n = 0; n < COUNT; ++n) d[n] = lab_uniform(0, 4); /* a grid: many ties */
    int64_t want[K];
    smallest_keys(d, want);

    /* pair heap (strided), packed heap and sorted list, fed in index order */
    float hd[K * STRIDE], ld[K];
    int64_t hi[K * STRIDE], li[K];
    uint64_t hp[K];
    double kd[K * STRIDE]; /* pcops_heap_keep on (double, int32) pairs, strided */
    int32_t ki[K * STRIDE];
    int64_t count = 0, kept = 0;
    for (int64_t j = 0; j < K; ++j) {
        ld[j] = INFINITY;
        li[j] = -1;
    }
    for (int64_t n = 0; n < COUNT; ++n) {
        if (count < K) {
            pcops_heap_push_f32(hd, hi, STRIDE, count, d[n], n);
            pcops_heap_push_u64(hp, 1, count, pcops_key_pack_f32(d[n], n));
            ++count;
        } else {
            if (pcops_key_greater_f32(hd[0], hi[0], d[n], n))
                pcops_heap_replace_top_f32(hd, hi, STRIDE, K, d[n], n);
            if (hp[0] > pcops_key_pack_f32(d[n], n))
                pcops_heap_replace_top_u64(hp, 1, K, pcops_key_pack_f32(d[n], n));
        }
        if (d[n] < ld[K - 1]) pcops_sorted_insert_f32(ld, li, K, d[n], n);
        if (kept < K || pcops_key_greater_f64(kd[0], ki[0], d[n], n))
            pcops_heap_keep_f64_i32(kd, ki, STRIDE, K, &kept, d[n], n);
    }
    lab_check(kept == K, "pcops_heap_keep: %lld entries, want %d", (long long)kept, K);
    pcops_heap_sort_f32(hd, hi, STRIDE, K);
    pcops_heap_sort_u64(hp, 1, K);
    pcops_heap_sort_f64_i32(kd, ki, STRIDE, K);
    /* the packed heap unpacked in place, as in a kNN output row (keys in the idx row) */
    int64_t urow[K];
    float ud[K];
    memcpy(urow, hp, sizeof urow);
    pcops_key_unpack_f32((const uint64_t*)urow, 1, K, ud, urow);
    for (int64_t j = 0; j < K; ++j) {
        lab_check(hi[j * STRIDE] == want[j] && hd[j * STRIDE] == d[want[j]],
                  "pair heap slot %lld: %lld, want %lld", (long long)j,
                  (long long)hi[j * STRIDE], (long long)want[j]);
        lab_check(pcops_key_index(hp[j]) == want[j] && pcops_key_dist_f32(hp[j]) == d[want[j]],
                  "packed heap slot %lld: %lld, want %lld", (long long)j,
                  (long long)pcops_key_index(hp[j]), (long long)want[j]);
        lab_check(li[j] == want[j], "sorted list slot %lld: %lld, want %lld", (long long)j,
                  (long long)li[j], (long long)want[j]);
        lab_check(ki[j * STRIDE] == want[j] && kd[j * STRIDE] == (double)d[want[j]],
                  "kept (f64_i32) heap slot %lld: %d, want %lld", (long long)j,
                  ki[j * STRIDE], (long long)want[j]);
        lab_check(urow[j] == want[j] && ud[j] == d[want[j]],
                  "unpacked slot %lld: %lld, want %lld", (long long)j, (long long)urow[j],
                  (long long)want[j]);
    }

    /* packed keys order like (dist2, idx) for dist2 >= +0, +inf included */
    for (int r = 0; r < 100000; ++r) {
        const float a = (lab_next() & 7) ? lab_uniform(0, 2) : INFINITY, b = lab_uniform(0, 2);
        const int64_t ia = (int64_t)(lab_next() % 1000), ib = (int64_t)(lab_next() % 1000);
        lab_check((pcops_key_pack_f32(a, ia) > pcops_key_pack_f32(b, ib)) ==
                      pcops_key_greater_f32(a, ia, b, ib),
                  "packed order of (%g, %lld) vs (%g, %lld)", a, (long long)ia, b, (long long)ib);
    }

    /* the carver: aligned pieces, the same total when counting and carving, saturation */
    pcops_carver count_only = pcops_carver_init(NULL);
    pcops_carve(&count_only, 3, 4);
    pcops_carve(&count_only, 1000, 8);
    pcops_carve(&count_only, 0, 8);
    const size_t bytes = pcops_carver_bytes(&count_only);
    lab_check(bytes == 256 + 8192 + 0, "carver counted %zu bytes, want 8448", bytes);
    char* base = (char*)lab_malloc(bytes);
    pcops_carver w = pcops_carver_init(base);
    char* p0 = (char*)pcops_carve(&w, 3, 4);
    char* p1 = (char*)pcops_carve(&w, 1000, 8);
    lab_check(p0 == base && p1 == base + 256 && pcops_carver_bytes(&w) == bytes,
              "carver pieces at offsets %td, %td", p0 - base, p1 - base);
    free(base);
    pcops_carver huge = pcops_carver_init(NULL);
    pcops_carve(&huge, INT64_MAX, 8);
    lab_check(pcops_carver_bytes(&huge) == SIZE_MAX, "an overflowing piece must saturate");
    pcops_carver negative = pcops_carver_init(NULL);
    pcops_carve(&negative, -1, 1);
    lab_check(pcops_carver_bytes(&negative) == SIZE_MAX, "a negative count must saturate");

    lab_check(pcops_valid_length(NULL, 0, 7) == 7, "no lengths: N");
    const int64_t lengths[3] = {-3, 4, 99};
    lab_check(pcops_valid_length(lengths, 0, 7) == 0 && pcops_valid_length(lengths, 1, 7) == 4 &&
                  pcops_valid_length(lengths, 2, 7) == 7,
              "lengths are clamped to [0, N]");
    lab_check(pcops_positive_mod(-1, 5) == 4 && pcops_positive_mod(7, 5) == 2, "positive mod");
    return lab_finish("lab_geometry");
}
