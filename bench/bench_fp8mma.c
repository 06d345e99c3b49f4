/* bench_fp8mma.c - the W4A8 grouped GEMM on mma.sync E4M3 (src/cuda/gemm_fp8.cu) alone, each
 * kernel (the first, MXFP4 only; the pipelined ones with 16 and 32 tokens a pass; the staged
 * ones with 16 / 32 / 64; the wgmma ones with 32 / 64 / 128 and the warp-specialized wgmma ones
 * with 64 / 128 (ws64, ws128), MXFP4 on sm_90 only; a kernel
 * whose launch fails is reported and left out) interleaved
 * point by point, on two shapes: gpt-oss-120b's FC1 (N = 2 x 2,880, K = 2,880,
 * MXFP4) over the EP8 shard's 16 experts, and GLM-5's EP8 FC1 (N = 4,096, K = 6,144, NVFP4) over
 * its 32, each expert with m rows, m = 8 .. 256. Counts first: bytes = the experts' FP4 data +
 * block scales + X codes and scales + FP32 Y; FLOPs = 2 x rows x N x K; floor = max(bytes / --bw,
 * FLOPs / --tflops) with --bw the copy rate (default 2,991 GB/s: the H100 of 2026-12-06; 4,200 on
 * the H200) and --tflops the FP8 rate (default 1,280: the FP8 GEMM measured on the H200; NVFP4
 * runs two MMAs per 32 of K, so its own ceiling is half that). Every expert in its own buffer
 * (133 / 427 MB of weights, past L2), X codes random finite E4M3 (never zeros), per-128 scales;
 * 5 warm-up launches, then --reps launches timed each with CUDA events: the median.
 * --shape / --m / --kernel run only the points named (probe.sh fp8: one launch under ncu).
 * The BF16 peer (the library's W4A16 GEMM at the same rows) is bench_gemm's; this program links
 * only the W4A8 kernel so that it can be carried to a device prebuilt. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_fp8.h"
#include "bench_ck.h"
#include "fm_rng.h"
#include "fp4moe/format.h"


static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* one shape: E experts of [N][K] in fmt, m = 8 .. 256 rows each, every kernel interleaved per point */
/* the points to run: every one, or the --shape / --m / --kernel given (a profiler's single launch) */
static const char *g_shape, *g_kernel;
static int         g_m;

static int run_shape(const char *name, fm_format fmt, int E, int N, int K, double bw, double tflops, int reps)
{
    if (g_shape && strcmp(g_shape, name)) return 0;
    enum { MMAX = 256 };
    fm_rng r;
    fm_rng_init(&r, 4242);
    size_t db, sb;
    if (fm_qtensor_bytes(fmt, N, K, &db, &sb) != FM_OK) return 1;
    const size_t pb = fm_fp8mma_pack_bytes(N, K), psb = fm_fp8mma_scales_bytes(fmt, N, K);
    uint8_t     *wq = malloc(pb * E), *wexp = malloc(sb * E), *wsp = malloc(psb * E);
    float       *src = malloc(sizeof(float) * (size_t)N * K), *hosc = malloc(sizeof(float) * E);
    fm_qtensor   q = {.fmt = fmt, .rows = N, .cols = K, .data = malloc(db), .scales = malloc(sb)};
    for (int e = 0; e < E; e++) { /* 2 drawn, the others byte copies in their own buffers */
        if (e < 2) {
            fm_rng_fill_normal(&r, src, (size_t)N * K, 0.02f);
            if (fm_quantize(src, NULL, &q) != FM_OK || fm_fp8mma_pack(&q, wq + pb * e) != FM_OK ||
                fm_fp8mma_pack_scales(&q, wsp + psb * e) != FM_OK)
                return 1;
            memcpy(wexp + sb * e, q.scales, sb);
            hosc[e] = q.global_scale;
        } else {
            memcpy(wq + pb * e, wq + pb * (e % 2), pb);
            memcpy(wexp + sb * e, wexp + sb * (e % 2), sb);
            memcpy(wsp + psb * e, wsp + psb * (e % 2), psb);
            hosc[e] = hosc[e % 2];
        }
    }
    const int ngrp = (K + 127) / 128, rows_max = E * MMAX;
    uint8_t  *xq = malloc((size_t)rows_max * K);
    float    *xs = malloc(sizeof(float) * (size_t)rows_max * ngrp);
    for (size_t i = 0; i < (size_t)rows_max * K; i++) {
        uint8_t c = (uint8_t)(fm_rng_uniform(&r) * 256);
        xq[i] = (c & 0x7f) == 0x7f ? 0x3f : c; /* no NaN code */
    }
    for (size_t i = 0; i < (size_t)rows_max * ngrp; i++) xs[i] = (float)(0.001 + 0.01 * fm_rng_uniform(&r));
    uint8_t *dwq, *dwexp, *dxq, *dwsp;
    float   *dxs, *dy, *dosc;
    int32_t *doff;
    CK(cudaMalloc((void **)&dwq, pb * E));
    CK(cudaMalloc((void **)&dwexp, sb * E));
    CK(cudaMalloc((void **)&dwsp, psb * E));
    CK(cudaMemcpy(dwsp, wsp, psb * E, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&dxq, (size_t)rows_max * K));
    CK(cudaMalloc((void **)&dxs, sizeof(float) * (size_t)rows_max * ngrp));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)rows_max * N));
    CK(cudaMalloc((void **)&doff, sizeof(int32_t) * (E + 1)));
    CK(cudaMalloc((void **)&dosc, sizeof(float) * E));
    CK(cudaMemcpy(dosc, hosc, sizeof(float) * E, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwq, wq, pb * E, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwexp, wexp, sb * E, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxq, xq, (size_t)rows_max * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxs, xs, sizeof(float) * (size_t)rows_max * ngrp, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[2];
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    const int ms[] = {8, 16, 32, 64, 128, 256};
    double   *t = malloc(sizeof(double) * reps);
    int       failed = 0;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
    for (int kern = FM_FP8MMA_FIRST; kern < FM_FP8MMA_KERNELS; kern++) { /* the kernels interleaved per point */
        if ((kern == FM_FP8MMA_FIRST || kern >= FM_FP8MMA_WG32) && fmt != FM_FORMAT_MXFP4) continue; /* MXFP4 only */
        if ((g_m && ms[mi] != g_m) || (g_kernel && strcmp(g_kernel, fm_fp8mma_kernel_name(kern)))) continue;
        const int m = ms[mi], rows = E * m;
        int32_t   off[257];
        for (int e = 0; e <= E; e++) off[e] = e * m;
        CK(cudaMemcpy(doff, off, sizeof(int32_t) * (size_t)(E + 1), cudaMemcpyHostToDevice));
        fm_fp8mma_args a = {.wq = dwq, .wexp = dwexp, .xq = dxq, .xs = dxs, .offsets = doff, .y = dy, .E = E, .N = N,
                            .K = K, .ldx = K, .ldxs = ngrp, .xs_per_128 = 1, .max_rows = rows, .kernel = kern,
                            .oscale = dosc, .fmt = fmt, .wsp = dwsp};
        for (int it = -5; it < reps; it++) {
            CK(cudaEventRecord(ev[0], st));
            const int le = fm_fp8mma_launch(&a, st);
            if (le != 0) { /* this kernel's point is left out; the others go on */
                fprintf(stderr, "%s %s m=%d: fm_fp8mma_launch failed: %s\n", name, fm_fp8mma_kernel_name(kern), m,
                        cudaGetErrorString((cudaError_t)le));
                failed = 1;
                break;
            }
            CK(cudaEventRecord(ev[1], st));
            CK(cudaEventSynchronize(ev[1]));
            float ms_;
            CK(cudaEventElapsedTime(&ms_, ev[0], ev[1]));
            if (it >= 0) t[it] = ms_ * 1e3;
        }
        if (failed) {
            failed = 0;
            CK(cudaStreamSynchronize(st));
            continue;
        }
        qsort(t, (size_t)reps, sizeof *t, cmpd);
        const double us = t[reps / 2];
        const double bytes = (double)E * (double)(db + sb) + (double)rows * K + 4.0 * rows * ngrp + 4.0 * rows * N;
        const double flops = 2.0 * rows * (double)N * K;
        const double fb = bytes / (bw * 1e3), ff = flops / (tflops * 1e6), floor_us = fb > ff ? fb : ff;
        printf("%-9s %-8s %6d %8d %10.1f %10.1f %9.1f %9.1f %9.2f %7s\n", name, fm_fp8mma_kernel_name(kern), m, rows, floor_us, us, flops / us / 1e6,
               bytes / us / 1e3, us / floor_us, fb > ff ? "bytes" : "flops");
        printf("csv,fp8mma,%s,%s,%d,%d,%.0f,%.0f,%.2f,%.2f\n", name, fm_fp8mma_kernel_name(kern), m, rows, bytes, flops, floor_us, us);
    }
    CK(cudaFree(dwq));
    CK(cudaFree(dwexp));
    CK(cudaFree(dwsp));
    CK(cudaFree(dxq));
    CK(cudaFree(dxs));
    CK(cudaFree(dy));
    CK(cudaFree(doff));
    CK(cudaFree(dosc));
    free(wq), free(wexp), free(wsp), free(src), free(q.data), free(q.scales), free(xq), free(xs), free(t), free(hosc);
    return 0;
}

int main(int argc, char **argv)
{
    double bw = 2991, tflops = 1280;
    int    reps = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tflops") && i + 1 < argc) tflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) g_shape = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) g_m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) g_kernel = argv[++i];
        else {
            fprintf(stderr, "usage: bench_fp8mma [--bw GB/s] [--tflops T] [--reps N] [--shape OSS8-FC1|EP8-FC1] "
                            "[--m 8|16|32|64|128|256] [--kernel NAME]\n");
            return 2;
        }
    }
    if (reps < 5) reps = 5;
    struct cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("# bench_fp8mma: W4A8 mma.sync E4M3 grouped GEMM, per-128 X scales; device %s; ceilings %.0f GB/s, %.0f "
           "TFLOP/s (FP8)\n", pr.name, bw, tflops);
    printf("%-9s %-8s %6s %8s %10s %10s %9s %9s %9s %7s\n", "shape", "kernel", "m", "rows", "floor_us", "time_us",
           "TFLOP/s", "GB/s", "x floor", "bound");
    int rc = run_shape("OSS8-FC1", FM_FORMAT_MXFP4, 16, 5760, 2880, bw, tflops, reps);
    if (!rc) rc = run_shape("EP8-FC1", FM_FORMAT_NVFP4, 32, 4096, 6144, bw, tflops, reps);
    return rc;
}

