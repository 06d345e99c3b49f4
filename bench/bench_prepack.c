/* bench_prepack.c - the host side of a cuda layer's create: fm_cuda_prepack of every
 * expert matrix of a GLM-5 EP8 shard (32 experts of w13 [4,096 x 6,144] and w2 [6,144 x
 * 2,048], NVFP4 and MXFP4), on one thread and on every core. What it bounds: the cold
 * start of `fp4moe run` / fm_layer_create_desc (issue 28: open + create <= 2 s), whose
 * other parts (device open, uploads) it does not time. Random codes and scales (never
 * zeros: the zero-block path is faster). Best of --reps (default 3) per matrix shape.
 * usage: bench_prepack [--reps N] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_internal.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double best_ms(const fm_qtensor *q, uint8_t *od, uint8_t *os, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        float  o;
        double t0 = now_ms();
        if (fm_cuda_prepack(q, od, os, &o) != FM_OK) {
            fprintf(stderr, "bench_prepack: %s\n", fm_last_error());
            exit(1);
        }
        double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int reps = argc > 2 && !strcmp(argv[1], "--reps") ? atoi(argv[2]) : 3;
    if (reps < 1) reps = 1;
    const int shapes[2][2] = {{4096, 6144}, {6144, 2048}}; /* w13 (gate + up), w2 */
    int       cores = omp_get_num_procs();
    printf("# bench_prepack: GLM-5 EP8 shard (32 experts), best of %d, %d cores\n", reps, cores);
    for (int f = 0; f < 2; f++) {
        fm_format fmt = f ? FM_FORMAT_MXFP4 : FM_FORMAT_NVFP4;
        double    shard[2] = {0, 0};
        for (int s = 0; s < 2; s++) {
            int        N = shapes[s][0], K = shapes[s][1];
            fm_qtensor q = {.fmt = fmt, .rows = N, .cols = K, .global_scale = 0.75f};
            size_t     db, sb, pd, ps;
            fm_qtensor_bytes(fmt, N, K, &db, &sb);
            fm_cuda_prepack_sizes(N, K, &pd, &ps);
            uint8_t *d = malloc(db), *sc = malloc(sb), *od = malloc(pd), *os = malloc(ps);
            if (!d || !sc || !od || !os) return 1;
            unsigned x = 12345u + (unsigned)s;
            for (size_t i = 0; i < db; i++) d[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
            for (size_t i = 0; i < sb; i++) { /* finite positive E4M3 / UE8M0 within 8 binades */
                x = x * 1664525u + 1013904223u;
                sc[i] = f ? (uint8_t)(120 + (x >> 28) % 8) : (uint8_t)(0x30 + (x >> 27) % 0x30);
            }
            q.data = d, q.scales = sc;
            omp_set_num_threads(1);
            double one = best_ms(&q, od, os, reps);
            omp_set_num_threads(cores);
            double all = best_ms(&q, od, os, reps);
            printf("%s %5d x %5d  %8.1f ms on 1 thread  %8.1f ms on %d  (%.2f GB/s of FP4 in)\n",
                   f ? "mxfp4" : "nvfp4", N, K, one, all, cores, (double)(db + sb) / (all * 1e6));
            shard[0] += 32 * one, shard[1] += 32 * all;
            free(d), free(sc), free(od), free(os);
        }
        printf("%s shard: %.0f ms on 1 thread, %.0f ms on %d\n", f ? "mxfp4" : "nvfp4", shard[0], shard[1], cores);
    }
    return 0;
}
