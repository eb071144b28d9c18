/*
 * cpu.h -- build helpers of the C (CPU) kernels; not part of the public C API. Includes
 * geometry.h (distances, keys, heaps, lengths, workspace carving).
 */
#ifndef PCOPS_CPU_H
#define PCOPS_CPU_H

#include "geometry.h"

/* Hot CPU loops are compiled twice, for AVX2 and for the x86-64 baseline, and the loader picks
 * one at start-up (GCC function multi-versioning), so a build from source runs well on any
 * x86-64 machine without -march=native. Neither clone enables FMA (target "avx2" does not
 * imply "fma"), which is a second reason the C code cannot contract. */
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PCOPS_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PCOPS_CPU_CLONES
#endif

/* The floating-point mode of the threads that run a CPU kernel: IEEE, whatever the caller set.
 * A caller may run with flush-to-zero / denormals-are-zero on (torch.set_flush_denormal(True)
 * sets both bits of its own thread's MXCSR); OpenMP's worker threads do not share that state,
 * so a kernel split over threads would mix two arithmetics, and neither would be the CUDA
 * kernels' (which keep denormals). Every parallel region, and every serial entry point, starts
 * with pcops_fpmode_ieee() (clears the flush bits of its thread, returns the previous mode) and
 * ends with pcops_fpmode_restore(). Both are volatile asm with a memory clobber: no load before
 * the switch and no store after the restore, so the arithmetic on the data stays between them. */
#if defined(__x86_64__) || defined(__i386__)
typedef unsigned int pcops_fpmode;
#define PCOPS_FP_FLUSH_BITS 0x8040u /* MXCSR: FTZ (bit 15) and DAZ (bit 6) */
static inline pcops_fpmode pcops_fpmode_ieee(void) {
    unsigned int csr;
    __asm__ __volatile__("stmxcsr %0" : "=m"(csr));
    if (csr & PCOPS_FP_FLUSH_BITS) {
        unsigned int ieee = csr & ~PCOPS_FP_FLUSH_BITS;
        __asm__ __volatile__("ldmxcsr %0" : : "m"(ieee) : "memory");
    }
    return csr;
}
static inline void pcops_fpmode_restore(pcops_fpmode csr) {
    if (csr & PCOPS_FP_FLUSH_BITS) __asm__ __volatile__("ldmxcsr %0" : : "m"(csr) : "memory");
}
#elif defined(__aarch64__)
typedef unsigned long pcops_fpmode;
#define PCOPS_FP_FLUSH_BITS ((1ul << 24) | (1ul << 19)) /* FPCR: FZ and FZ16 */
static inline pcops_fpmode pcops_fpmode_ieee(void) {
    unsigned long fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    if (fpcr & PCOPS_FP_FLUSH_BITS)
        __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr & ~PCOPS_FP_FLUSH_BITS) : "memory");
    return fpcr;
}
static inline void pcops_fpmode_restore(pcops_fpmode fpcr) {
    if (fpcr & PCOPS_FP_FLUSH_BITS) __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr) : "memory");
}
#else
typedef int pcops_fpmode; /* no flush modes known here: nothing to switch */
static inline pcops_fpmode pcops_fpmode_ieee(void) { return 0; }
static inline void pcops_fpmode_restore(pcops_fpmode mode) { (void)mode; }
#endif

#endif /* PCOPS_CPU_H */
