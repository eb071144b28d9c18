/*
 * phases_circle_nms.cu -- where the time of the circle NMS block path and flow path goes: built
 * against their headers (kernels/circle_nms/block.cuh, flow.cuh) with PCOPS_NMS_PHASES
 * defined, so that thread 0 of the block kernel prints the clock64 cycles of each phase (sort,
 * grid, cells, lists, scan, outputs) and the last block of the flow kernel its own (loads,
 * order check, grid barrier, pairs, decisions, outputs, with globaltimer stamps across
 * blocks); it times both with CUDA events (L2 flushed; the printf inflates them) on the peer
 * benchmark's kind of input: N boxes uniform in a 100 m x 100 m square, radius 1, scores
 * descending (the block path skips its sort) or random. Not part of `make -C lab` (it compiles
 * the kernels itself; kernels/status.c for the status strings):
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Ikernels \
 *        lab/phases_circle_nms.cu kernels/status.c -Xcompiler -fopenmp -o /tmp/nms_phases
 *   /tmp/nms_phases
 */
#define PCOPS_NMS_PHASES 1
#include "circle_nms/block.cuh"
#include "circle_nms/flow.cuh"

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
            cudaMalloc(&ws, 64 << 20);  // more than the flow path's workspace at these sizes
            cudaMemcpy(dc, c.data(), sizeof(float) * 2 * N, cudaMemcpyHostToDevice);
            cudaMemcpy(ds, s.data(), sizeof(float) * N, cudaMemcpyHostToDevice);
            cudaEvent_t a, b;
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            for (int flow = 0; flow < 2; ++flow) {
                for (int r = 0; r < 4; ++r) {  // the first call warms up
                    cudaMemsetAsync(flush, 0, kFlushBytes);  // L2 flushed, as the benchmarks do
                    cudaEventRecord(a);
                    const cudaError_t e =
                        flow ? launch_flow(dc, 2, ds, (const int64_t*)nullptr, N, 1.0, ws, dm,
                                           di, dn, 0)
                             : launch_block(dc, 2, ds, (const int64_t*)nullptr, N, 1.0, dm, di,
                                            dn, 0);
                    cudaEventRecord(b);
                    cudaEventSynchronize(b);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, a, b);
                    int64_t k = 0;
                    cudaMemcpy(&k, dn, sizeof(int64_t), cudaMemcpyDeviceToHost);
                    if (r > 0)
                        printf("%s N=%d %s path: %.4f ms (events), kept %lld, err %d\n",
                               shuffled ? "random scores" : "descending scores", N,
                               flow ? "flow" : "block", ms,
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
