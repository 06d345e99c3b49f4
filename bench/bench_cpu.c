/* bench_cpu.c - the fast CPU path on a GLM-5 EP8 shard (32 experts, hidden
 * 6144, intermediate 2048, top-8, sigmoid router, NVFP4 weights) at 1, 4, 16
 * and 64 tokens, against this machine's memory read bandwidth measured in the
 * same run, and against the reference backend at 1 and 4 tokens.
 *
 *   bench_cpu [--quick] [--runs N] [--ref-runs N] [--bw-mib N]
 *
 * Method (printed with the results):
 *  - bandwidth: a multi-threaded uint64 sum over a 1 GiB buffer (first touched
 *    in parallel), median of 5 passes;
 *  - each timed forward gets a fresh random input, hence a fresh routing; 2
 *    warm-up runs, then the median of --runs runs (wall clock around
 *    fm_layer_forward);
 *  - bytes moved per run = FP4 data + E4M3 scales of the experts that run's
 *    routing actually activates (each counted once, as the fast path streams
 *    them once) + router weights + the BF16 input + the FP32 output;
 *  - --quick (hidden 1024, inter 512) is a smoke test: its ~28 MB of weights can
 *    sit in a large last-level cache, so its ratio can exceed 100 %;
 *  - weights are random FP4 bytes with random in-range E4M3 scales: the time of
 *    a forward does not depend on their values, and quantizing 1.2 G random
 *    floats would take longer than the benchmark.
 * The table is markdown, for bench/RESULTS.md. Timings on a busy machine are
 * noisy; the bandwidth is measured in the same run so the ratio stays fair.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4moe.h"
#include "cpu/cpu_internal.h"
#include "moe/moe_internal.h"

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_normal(uint64_t *s)
{
    double u1 = ((rng_next(s) >> 11) + 1) * 0x1.0p-53, u2 = (rng_next(s) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* GB/s of a parallel read of `mib` MiB (median of 5 passes). */
static double measure_read_bw(size_t mib)
{
    size_t n = mib * (1u << 20) / sizeof(uint64_t);
    uint64_t *b = malloc(n * sizeof *b);
    if (!b) return 0.0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) b[i] = i; /* first touch by the reading threads */
    double gbs[5];
    volatile uint64_t sink = 0;
    for (int r = 0; r < 5; r++) {
        uint64_t s = 0;
        double t = omp_get_wtime();
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += b[i];
        t = omp_get_wtime() - t;
        sink += s;
        gbs[r] = (double)(n * sizeof *b) / t / 1e9;
    }
    (void)sink;
    free(b);
    return median(gbs, 5);
}

/* Fill a layer with random FP4 weights (see the header comment). */
static void fill_expert(fm_qtensor *q, int64_t rows, int64_t cols, uint64_t seed)
{
    size_t db = (size_t)(rows * cols / 2), sb = (size_t)(rows * cols / 16);
    q->fmt = FM_FORMAT_NVFP4;
    q->rows = rows;
    q->cols = cols;
    q->data = malloc(db);
    q->scales = malloc(sb);
    q->global_scale = 1.0f / 2048.0f;
    if (!q->data || !q->scales) {
        fprintf(stderr, "bench_cpu: out of memory\n");
        exit(1);
    }
    uint8_t *d = q->data;
#pragma omp parallel
    {
        uint64_t s = seed ^ (uint64_t)omp_get_thread_num() << 40;
#pragma omp for schedule(static)
        for (size_t i = 0; i < db; i += 8) {
            uint64_t v = rng_next(&s);
            memcpy(d + i, &v, db - i < 8 ? db - i : 8);
        }
#pragma omp for schedule(static)
        for (size_t i = 0; i < sb; i++) q->scales[i] = (uint8_t)(0x30 + rng_next(&s) % 40); /* E4M3 0.5 .. 15 */
    }
}

/* Bytes the fast path must move for input x: the active experts' weights and
 * scales, router weights, input and output. *active = experts used. */
static double bytes_moved(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T, int *active)
{
    float *logits = malloc(sizeof(float) * (size_t)T * c->n_experts), *wts = malloc(sizeof(float) * T * c->top_k);
    int32_t *ids = malloc(sizeof(int32_t) * T * c->top_k);
    char *used = calloc((size_t)c->n_experts, 1);
    fm_moe_router_logits(c, w->router_w, x, T, logits);
    if (fm_moe_route(c, w->router_bias, logits, T, ids, wts) != FM_OK) exit(1);
    for (int i = 0; i < T * c->top_k; i++) used[ids[i]] = 1;
    double per_expert = (2.0 * c->inter * c->hidden + (double)c->hidden * c->inter) * (0.5 + 1.0 / 16);
    double b = (double)c->n_experts * c->hidden * 4 + (double)T * c->hidden * (2 + 4);
    *active = 0;
    for (int e = 0; e < c->n_experts; e++) *active += used[e];
    b += *active * per_expert;
    free(logits), free(wts), free(ids), free(used);
    return b;
}

int main(int argc, char **argv)
{
    int quick = 0, runs = 9, ref_runs = 3;
    size_t bw_mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ref-runs") && i + 1 < argc) ref_runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bw-mib") && i + 1 < argc) bw_mib = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_cpu [--quick] [--runs N] [--ref-runs N] [--bw-mib N]\n"
                    "  --quick     hidden 1024, inter 512 instead of GLM-5's 6144 / 2048\n"
                    "  --runs      timed runs per token count (median; default 9)\n"
                    "  --ref-runs  reference runs at 1 and 4 tokens (default 3; 0 = skip)\n"
                    "  --bw-mib    buffer of the bandwidth measurement (default 1024)\n");
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    enum { MAXT = 64 };
    static const int k_tokens[] = {1, 4, 16, 64};

    fm_moe_config c;
    fm_moe_config_default(&c); /* GLM-5 EP8 shard */
    if (quick) c.hidden = 1024, c.inter = 512;
    int E = c.n_experts, H = c.hidden, I = c.inter;

    fprintf(stderr, "bench_cpu: measuring memory read bandwidth (%zu MiB, %d threads)...\n", bw_mib,
            omp_get_max_threads());
    double bw = measure_read_bw(bw_mib);

    fprintf(stderr, "bench_cpu: building %d NVFP4 experts (hidden %d, inter %d)...\n", E, H, I);
    uint64_t seed = 0x5eed;
    float *router_w = malloc(sizeof(float) * (size_t)E * H);
    for (size_t i = 0; i < (size_t)E * H; i++) router_w[i] = rng_normal(&seed) / sqrtf((float)H);
    fm_qtensor *w13 = calloc(E, sizeof *w13), *w2 = calloc(E, sizeof *w2);
    for (int e = 0; e < E; e++) {
        fill_expert(&w13[e], 2LL * I, H, rng_next(&seed));
        fill_expert(&w2[e], H, I, rng_next(&seed));
    }
    fm_moe_weights w = {.router_w = router_w, .w13 = w13, .w2 = w2};
    fm_layer *fast = NULL, *ref = NULL;
    fm_status st = fm_layer_create(FM_BACKEND_CPU, &c, &w, MAXT, &fast);
    if (st == FM_OK && ref_runs > 0) st = fm_layer_create(FM_BACKEND_CPU_REF, &c, &w, 4, &ref);
    if (st != FM_OK) {
        fprintf(stderr, "bench_cpu: %s: %s\n", fm_status_name(st), fm_last_error());
        return 1;
    }

    int n_inputs = runs + 2;
    uint16_t *xs = malloc(sizeof(uint16_t) * (size_t)n_inputs * MAXT * H);
    for (size_t i = 0; i < (size_t)n_inputs * MAXT * H; i++) xs[i] = fm_bf16_encode(rng_normal(&seed));
    float *out = malloc(sizeof(float) * MAXT * H), *out_ref = malloc(sizeof(float) * MAXT * H);
    double *t_ms = malloc(sizeof(double) * runs), *gbs = malloc(sizeof(double) * runs);

    printf("## fp4moe CPU benchmark: %s shard, %d experts, hidden %d, inter %d, top-%d, NVFP4\n\n",
           quick ? "reduced (--quick)" : "GLM-5 EP8", E, H, I, c.top_k);
    const char *isa = "?";
    (void)fm_cpu_gemm_select(&isa);
    printf("kernels: %s; ", isa);
    printf("threads %d, memory read bandwidth (parallel sum over %zu MiB, median of 5): **%.2f GB/s**; "
           "median of %d runs after 2 warm-up runs, fresh routing each run\n\n",
           omp_get_max_threads(), bw_mib, bw, runs);
    printf("| tokens | active experts | time (ms) | bytes moved (MB) | achieved GB/s | %% of read BW | "
           "reference (ms) | speedup | NMSE vs ref |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t ti = 0; ti < sizeof k_tokens / sizeof k_tokens[0]; ti++) {
        int T = k_tokens[ti];
        fprintf(stderr, "bench_cpu: %d token(s)...\n", T);
        double act_sum = 0, mb_sum = 0;
        for (int r = 0; r < n_inputs; r++) {
            const uint16_t *x = xs + (size_t)r * MAXT * H;
            double t0 = omp_get_wtime();
            st = fm_layer_forward(fast, x, T, out, NULL);
            double t = omp_get_wtime() - t0;
            if (st != FM_OK) {
                fprintf(stderr, "bench_cpu: %s: %s\n", fm_status_name(st), fm_last_error());
                return 1;
            }
            if (r < 2) continue; /* warm-up */
            int active = 0;
            double b = bytes_moved(&c, &w, x, T, &active);
            t_ms[r - 2] = t * 1e3;
            gbs[r - 2] = b / t / 1e9;
            act_sum += active;
            mb_sum += b / 1e6;
        }
        double tm = median(t_ms, runs), g = median(gbs, runs);
        char ref_ms[32] = "-", speed[32] = "-", nmse[32] = "-";
        if (ref && T <= 4) {
            double *rt = malloc(sizeof(double) * ref_runs);
            double num = 0, den = 0;
            for (int r = 0; r < ref_runs; r++) {
                const uint16_t *x = xs + (size_t)r * MAXT * H;
                fprintf(stderr, "bench_cpu: reference %d token(s), run %d/%d...\n", T, r + 1, ref_runs);
                double t0 = omp_get_wtime();
                if (fm_layer_forward(ref, x, T, out_ref, NULL) != FM_OK) return 1;
                rt[r] = (omp_get_wtime() - t0) * 1e3;
                if (fm_layer_forward(fast, x, T, out, NULL) != FM_OK) return 1;
                for (int i = 0; i < T * H; i++) {
                    num += ((double)out[i] - out_ref[i]) * ((double)out[i] - out_ref[i]);
                    den += (double)out_ref[i] * out_ref[i];
                }
            }
            double rm = median(rt, ref_runs);
            snprintf(ref_ms, sizeof ref_ms, "%.1f", rm);
            snprintf(speed, sizeof speed, "%.1fx", rm / tm);
            snprintf(nmse, sizeof nmse, "%.1e", den > 0 ? num / den : num);
            free(rt);
        }
        printf("| %d | %.1f | %.3f | %.1f | %.2f | %.0f %% | %s | %s | %s |\n", T, act_sum / runs, tm, mb_sum / runs, g,
               100.0 * g / bw, ref_ms, speed, nmse);
        fflush(stdout);
    }
    if (quick) printf("\n--quick: %.0f MB of weights may sit in the last-level cache; use it as a smoke test, not for "
                      "the bandwidth ratio.\n", E * (3.0 * H * I) * (0.5 + 1.0 / 16) / 1e6);
    printf("\nbytes moved = active experts' FP4 data + E4M3 scales (each once) + router weights + BF16 input + FP32 "
           "output; %% of read BW = achieved GB/s / measured read bandwidth.\n");
    fm_layer_destroy(fast);
    fm_layer_destroy(ref);
    for (int e = 0; e < E; e++) free(w13[e].data), free(w13[e].scales), free(w2[e].data), free(w2[e].scales);
    free(w13), free(w2), free(router_w), free(xs), free(out), free(out_ref), free(t_ms), free(gbs);
    return 0;
}
