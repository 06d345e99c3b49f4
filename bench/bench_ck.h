/* bench_ck.h - CK(call): a CUDA runtime call that must succeed in a benchmark, else the
 * file, line, call and CUDA's message on stderr and exit(1) (benchmarks stop at the first
 * error rather than time a broken run). */
#ifndef FM_BENCH_CK_H
#define FM_BENCH_CK_H
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#endif
