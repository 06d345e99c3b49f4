/* bench_route.c - the router-logits kernels alone (GLM-5: 256 experts, hidden 6,144,
 * FP32 router weights, BF16 x), each named (fm_moe_router_logits_launch_kind): one
 * warp per logit with 16 or 48 loads in flight per lane, the 16 x 32 tiled kernel,
 * the staged kernel, the oneshot kernels (every load of a CTA at once: one wait, or 4 k
 * ranges summed as they land; the kind that really ran is printed: 4 = staged, their
 * fallback) and the layer's dispatch (auto). Per T: median over --reps of an event pair around
 * one launch (launch latency included, as in a graph), NR router copies rotated so
 * the 6.3 MB router is read from DRAM as in a layer whose experts flushed L2. Floor =
 * (router + x bytes) / --bw. All kernels give the same bits (test_cuda_route).
 * Usage: bench_route [--reps N] [--bw GB/s] [--ts T1,T2,...]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/moe_kernels.h"
#include "fm_rng.h"
#include "fp4moe.h"

#include "bench_ck.h"

enum { NR = 12 }; /* 12 x 6.3 MB routers: more than the H200's L2 */

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int    reps = 30, ts[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096}, nt = 11;
    double bw = 4200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--ts") && i + 1 < argc) {
            char *p = argv[++i];
            nt = 0;
            while (*p && nt < 16) {
                ts[nt++] = atoi(p);
                while (*p && *p != ',') p++;
                if (*p == ',') p++;
            }
        } else {
            fprintf(stderr, "usage: bench_route [--reps N] [--bw GB/s] [--ts T1,T2,...]\n");
            return 2;
        }
    }
    if (reps < 3) reps = 3;
    const int E = 256, H = 6144, MAXT = 4096;
    for (int i = 0; i < nt; i++)
        if (ts[i] < 1 || ts[i] > MAXT) {
            fprintf(stderr, "bench_route: T=%d outside [1, %d]\n", ts[i], MAXT);
            return 2;
        }
    fm_rng r;
    fm_rng_init(&r, 777);
    float    *hw = malloc(sizeof(float) * (size_t)E * H);
    uint16_t *hx = malloc(sizeof(uint16_t) * (size_t)MAXT * H);
    fm_rng_fill_normal(&r, hw, (size_t)E * H, 0.0128f);
    for (size_t i = 0; i < (size_t)MAXT * H; i++) hx[i] = fm_bf16_encode(fm_rng_normal(&r));
    float    *dw[NR], *dl;
    uint16_t *dx[2];
    for (int i = 0; i < NR; i++) {
        CK(cudaMalloc((void **)&dw[i], sizeof(float) * (size_t)E * H));
        CK(cudaMemcpy(dw[i], hw, sizeof(float) * (size_t)E * H, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc((void **)&dx[i], sizeof(uint16_t) * (size_t)MAXT * H));
        CK(cudaMemcpy(dx[i], hx, sizeof(uint16_t) * (size_t)MAXT * H, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)MAXT * E));
    CK(cudaDeviceSynchronize()); /* the pageable uploads landed before the non-blocking stream reads */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[2];
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    const int kinds[] = {FM_ROUTER_WARP16,  FM_ROUTER_WARP48,   FM_ROUTER_TILED, FM_ROUTER_STAGED,
                         FM_ROUTER_ONESHOT, FM_ROUTER_ONESHOT4, FM_ROUTER_AUTO};
    const char *const names[] = {"warp16", "warp48", "tiled", "staged", "oneshot", "oneshot4", "auto"};
    enum { NK = sizeof kinds / sizeof kinds[0] };
    double           *t = malloc(sizeof(double) * reps);
    printf("# bench_route: router logits, %d experts, hidden %d, FP32 router, %d copies rotated; %.0f GB/s\n", E, H,
           NR, bw);
    printf("%6s %9s |", "T", "floor_us");
    for (int ki = 0; ki < NK; ki++) printf(" %12s", names[ki]);
    printf(" | us (x floor)\n");
    for (int ti = 0; ti < nt; ti++) {
        const int    T = ts[ti];
        const double floor_us = ((double)E * H * 4 + (double)T * H * 2 + (double)T * E * 4) / (bw * 1e3);
        double       med[NK];
        for (int ki = 0; ki < NK; ki++) {
            for (int it = -3; it < reps; it++) {
                const int j = (it + 3) % NR;
                CK(cudaEventRecord(ev[0], st));
                if (fm_moe_router_logits_launch_kind(dx[j & 1], dw[j], T, E, H, dl, st, kinds[ki]) != 0) {
                    fprintf(stderr, "bench_route: launch failed (%s, T=%d)\n", names[ki], T);
                    return 1;
                }
                CK(cudaEventRecord(ev[1], st));
                CK(cudaEventSynchronize(ev[1]));
                float ms;
                CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
                if (it >= 0) t[it] = ms * 1e3;
            }
            qsort(t, (size_t)reps, sizeof *t, cmpd);
            med[ki] = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        }
        printf("%6d %9.1f |", T, floor_us);
        for (int ki = 0; ki < NK; ki++) printf(" %5.1f (%5.1f)", med[ki], med[ki] / floor_us);
        /* the oneshot kernels fall back to staged where their shared memory does not fit */
        printf(" | ran: oneshot=%d oneshot4=%d\n", fm_moe_router_logits_kind(dx[0], dw[0], T, E, H, FM_ROUTER_ONESHOT),
               fm_moe_router_logits_kind(dx[0], dw[0], T, E, H, FM_ROUTER_ONESHOT4));
        fflush(stdout);
    }
    for (int i = 0; i < NR; i++) cudaFree(dw[i]);
    cudaFree(dx[0]), cudaFree(dx[1]), cudaFree(dl);
    free(hw), free(hx), free(t);
    return 0;
}
