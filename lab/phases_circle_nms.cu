/*
 * phases_circle_nms.cu -- where the time of the single-block circle NMS kernel v2 (variant 4),
 * of the pair-tile path (variant 5) and of the dataflow path (variant 6) goes: includes
 * kernels/circle_nms.cu with
 * PCOPS_NMS_PHASES defined, so that thread 0 of the v2 body prints the clock64 cycles of each
 * phase (sort, grid, cells, lists, scan, outputs) and block 0 of the tiles kernel its own
 * (order check, tiles, the wait for the other blocks, ranks and flags, scan and decode, the v2
 * finish) with globaltimer stamps across blocks, and the last block of the dataflow kernel its
 * own (loads, order check, grid barrier, pairs, decisions, outputs: the block that finishes
 * last); it times variants 4, 5 and 6 with CUDA events
 * (L2 flushed; the printf inflates them) on the peer benchmark's kind of input: N boxes uniform
 * in a 100 m x 100 m square, radius 1, scores descending (the sort is skipped) or random. Not
 * part of `make -C lab` (it is a .cu that compiles the kernel itself):
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Ikernels \
 *        lab/phases_circle_nms.cu kernels/status.c -Xcompiler -fopenmp -o /tmp/nms_phases
 *   /tmp/nms_phases
 */
#define PCOPS_NMS_PHASES 1
#include "circle_nms.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
    const size_t kFlushBytes = size_t(256) << 20;
    void* flush = nullptr;
    cudaMalloc(&flush, kFlushBytes);
    for (int shuffled = 0; shuffled < 2; ++shuffled) {
        for (int N : {500, 1000, 2048, 4096}) {
            std::vector<float> c(2 * N), s(N);
            srand(1000 + N);
            for (int i = 0; i < N; ++i) {
                c[2 * i] = 100.f * rand() / RAND_MAX;
                c[2 * i + 1] = 100.f * rand() / RAND_MAX;
                s[i] = shuffled ? (float)rand() / RAND_MAX : (float)((double)(N - i) / N);
            }
            float *dc, *ds;
            bool* dm;
            int64_t *di, *dn;
            void* ws;
            cudaMalloc(&dc, sizeof(float) * 2 * N);
            cudaMalloc(&ds, sizeof(float) * N);
            cudaMalloc(&dm, N);
            cudaMalloc(&di, sizeof(int64_t) * N);
            cudaMalloc(&dn, sizeof(int64_t));
            cudaMalloc(&ws, 64 << 20);  // more than any variant's workspace at these sizes
            cudaMemcpy(dc, c.data(), sizeof(float) * 2 * N, cudaMemcpyHostToDevice);
            cudaMemcpy(ds, s.data(), sizeof(float) * N, cudaMemcpyHostToDevice);
            cudaEvent_t a, b;
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            for (int v = 4; v <= 6; ++v) {
                if (v == 5 && N > PCOPS_CIRCLE_NMS_CUDA_TILE_MAX) continue;
                for (int r = 0; r < 4; ++r) {  // the first call warms up
                    cudaMemsetAsync(flush, 0, kFlushBytes);  // L2 flushed, as the benchmarks do
                    cudaEventRecord(a);
                    const cudaError_t e = pcops_circle_nms_cuda_path(
                        PCOPS_FLOAT32, dc, 2, PCOPS_FLOAT32, ds, nullptr, N, 1.0, ws, dm, di,
                        dn, v, 0);
                    cudaEventRecord(b);
                    cudaEventSynchronize(b);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, a, b);
                    int64_t k = 0;
                    cudaMemcpy(&k, dn, sizeof(int64_t), cudaMemcpyDeviceToHost);
                    if (r > 0)
                        printf("%s N=%d variant %d: %.4f ms (events), kept %lld, err %d\n",
                               shuffled ? "random scores" : "descending scores", N, v, ms,
                               (long long)k, (int)e);
                }
            }
            cudaFree(dc);
            cudaFree(ds);
            cudaFree(dm);
            cudaFree(di);
            cudaFree(dn);
            cudaFree(ws);
        }
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
