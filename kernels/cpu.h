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

#endif /* PCOPS_CPU_H */
