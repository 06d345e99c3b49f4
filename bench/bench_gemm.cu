/* bench_gemm.cu - the mma FP4 grouped GEMM on GLM-5 shapes (issue 4).
 *
 * For EP8 (32 experts: FC1 N=4096 K=6144, FC2 N=6144 K=2048) and TP8 (256
 * experts: FC1 N=512 K=6144, FC2 N=6144 K=256) and 1..1024 rows per expert it
 * times fm_cuda_gemm (FM_CUDA_EPI_NONE) with CUDA events, median of REPS launches after
 * warm-up, the launches enqueued back to back with an event between each two (time_gemm:
 * the kernel on the GPU, not the host's launch path; the best tile of each point is
 * timed again one launch at a time, host path included, as the `csvs,` line). The
 * weights (random bits in the prepacked layout, generated on the device: the kernel's
 * speed does not depend on the values, but never zeros) are 0.2-0.45 GB per shape in
 * two sets used alternately, several times the 60 MB L2, so every launch streams
 * them from HBM; X rotates between two buffers. Bytes counted once: FP4 data +
 * E4M3 scales (UE8M0 per 32 for MXFP4; checkpoint sizes) + X (BF16) + Y (BF16). The copy ceiling is a
 * 2 GiB device-to-device cudaMemcpy in this run; the BF16 GEMM ceiling comes
 * from torch in the same gpu-check run (--bf16-tflops, else 0 = not used).
 *
 * Output: one CSV line per tile and point (prefix "csv,"; "csvs,<shape>,<rows>,<tile>,<us>":
 * the best tile timed one launch at a time; "csvc,...": the best tile in three launch modes
 * interleaved round by round, see time_modes), then a table.
 * Same-size references, same method (queued, two buffers alternated): "# read,<shape>,<bytes>,<us>"
 * = a plain read of the shape's weight set (FP4 data + scale bytes), the bytes every 1-8-row
 * point streams, so the fixed cost of one launch of that size is in view next to the floor
 * (which is the 2 GiB copy's bandwidth); "# empty kernel" = the interval of an empty launch.
 * --timeline FILE (with --shape/--m/--tile, an mma tile, a probe build -DFM_PROBE_TIMELINE=ON):
 * 4 queued launches, every CTA's SM, start and end (ns) to FILE as CSV.
 * --model gpt-oss-120b: gpt-oss-120b's MXFP4 shapes instead (all 128 experts and the EP8 shard's 16,
 * FC1 N 5,760 and FC2 N 2,880, K 2,880; 1..256 rows per expert).
 * Usage: bench_gemm [--model glm-5|gpt-oss-120b] [--bf16-tflops X] [--reps N] [--quick] [--shape S --m M --tile T [--timeline F]]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "fp4moe/plan.h"
#include "probe_tl.h"

#include "bench_ck.h"

__global__ void fill_random(uint32_t *p, size_t n, uint32_t seed, uint32_t mask, uint32_t lo, uint32_t span)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16;
        x *= 0x7feb352du;
        x ^= x >> 15;
        x *= 0x846ca68bu;
        x ^= x >> 16;
        if (span) { /* 4 scale bytes, each in [lo, lo + span) */
            uint32_t v = 0;
            for (int b = 0; b < 4; b++) v |= (lo + ((x >> (8 * b)) & 0xFF) % span) << (8 * b);
            x = v;
        }
        p[i] = x & mask;
    }
}

__global__ void fill_bf16(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2246822519u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        float f = ((float)(x & 0xFFFF) / 65536.0f - 0.5f) * 4.0f; /* uniform(-2, 2), never all zero */
        uint32_t u;
        memcpy(&u, &f, 4);
        p[i] = (uint16_t)(u >> 16);
    }
}

/* the same-size read reference: every byte of [a, a + na x 16) and [b, b + nb x 16) read
 * once, in one launch as the GEMM reads its data and scale bytes, 4 loads in flight a thread */
__global__ void read_ref(const uint4 *a, size_t na, const uint4 *b, size_t nb, uint32_t *sink)
{
    uint32_t acc = 0;
    size_t   stride = (size_t)gridDim.x * blockDim.x, n = na + nb;
    size_t   i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            size_t q = i + j * stride;
            v[j] = __ldcs(q < na ? a + q : b + (q - na));
        }
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n; i += stride) {
        uint4 v = __ldcs(i < na ? a + i : b + (i - na));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc; /* (almost) never true; keeps the loads */
}

__global__ void empty_kernel(void) {}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const char *name;
    int         E, N, K;
} shape;

static double copy_tbs(void)
{
    size_t bytes = (size_t)2 << 30;
    void  *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[15];
    for (int i = 0; i < 15; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    qsort(t, 15, sizeof(float), cmp_f);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (t[7] * 1e-3) / 1e12; /* read + write */
}

int main(int argc, char **argv)
{
    double bf16_tflops = 0;
    int    reps = 25, quick = 0, only_m = 0; /* --shape/--m/--tile: one configuration (for ncu) */
    const char *only_shape = NULL, *only_tile = NULL, *timeline = NULL;
    /* --fdet: the FINALIZE_DET epilogue (FP32 rows x router weight to scratch, then the
     * slot-order reduce into [rows/8][N], top-8 slots = 8 consecutive rows), at the
     * points whose scratch fits in 2.2 GB; lines start with "csvf," */
    int fdet = 0, tl_pdl = 0, oss = 0; /* oss: --model gpt-oss-120b */ /* --timeline launches: 0 = event between each two, 1 (--pdl) = with PDL and
                                 2 (--chain) = plain, both without events between them */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bf16-tflops") && i + 1 < argc) bf16_tflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only_shape = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) only_m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tile") && i + 1 < argc) only_tile = argv[++i];
        else if (!strcmp(argv[i], "--fdet")) fdet = 1;
        else if (!strcmp(argv[i], "--timeline") && i + 1 < argc) timeline = argv[++i];
        else if (!strcmp(argv[i], "--pdl")) tl_pdl = 1;
        else if (!strcmp(argv[i], "--chain")) tl_pdl = 2;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "gpt-oss-120b")) oss = 1;
            else if (strcmp(m, "glm-5")) {
                fprintf(stderr, "bench_gemm: --model glm-5 | gpt-oss-120b, not %s\n", m);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_gemm [--model glm-5|gpt-oss-120b] [--bf16-tflops X] [--reps N] [--quick] "
                            "[--fdet] [--shape S --m M --tile T [--timeline F [--pdl|--chain]]]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_tbs();
    printf("# device %s, %d SMs, L2 %d MB; copy ceiling %.3f TB/s (2 GiB D2D, read+write); BF16 ceiling %.0f TFLOP/s\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bw, bf16_tflops);
    printf("# timing: queued (launches back to back, an event between each two, median of %d)\n", reps);
    static const shape glm_shapes[] = {
        {"EP8-FC1", 32, 4096, 6144}, {"EP8-FC2", 32, 6144, 2048}, {"TP8-FC1", 256, 512, 6144}, {"TP8-FC2", 256, 6144, 256}};
    /* gpt-oss-120b (MXFP4, hidden = intermediate = 2,880): all 128 experts on one GPU and the
     * EP8 shard's 16; FC1 is gate and up (2 x 2,880). K = 2,880 is 45 chunks of 64, not a
     * multiple of 128 or 256: the k128 / k256 tiles run a partial last stage, which GLM-5's
     * shapes (K 6,144 / 2,048 / 256) never do. */
    static const shape oss_shapes[] = {
        {"OSS-FC1", 128, 5760, 2880}, {"OSS-FC2", 128, 2880, 2880}, {"OSS8-FC1", 16, 5760, 2880}, {"OSS8-FC2", 16, 2880, 2880}};
    const shape     *shapes = oss ? oss_shapes : glm_shapes;
    const size_t     nshapes = 4;
    static const int ms_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    static const int ms_oss[] = {1, 2, 4, 8, 16, 32, 64, 128, 256}; /* T = 4,096 local: 128 rows / expert */
    static const int ms_quick[] = {1, 8, 32, 128};
    const int       *ms = quick ? ms_quick : oss ? ms_oss : ms_full;
    int              nms = quick ? 4 : oss ? 9 : 11;
    /* every compiled tile of both families (wgmma only on compute capability 9.0) */
    fm_tile      tiles[64];
    int          tpacked[64] = {0}; /* wgmma tiles run twice: packed X (fast kernel) and natural X */
    int          tnb1[64] = {0};    /* one-token-group mma tiles run again with feature_blocks: _nb1 (short K), _nb4 (long K) */
    size_t       ntile = 0, nmma = 0, nwg = 0;
    const fm_tile *mt_ = fm_mma_tiles(&nmma), *wt_ = fm_wgmma_tiles(&nwg);
    for (size_t i = 0; i < nmma && ntile + 2 <= 64; i++) {
        tiles[ntile++] = mt_[i];
        if (fm_mma_tile_has_mb(&mt_[i])) { /* tiles with a multi-block kernel: the other block count too */
            tiles[ntile] = tiles[ntile - 1];
            tnb1[ntile++] = 1;
        }
    }
    if (prop.major == 9 && prop.minor == 0)
        for (size_t i = 0; i < nwg && ntile + 2 <= 64; i++)
            for (int pk = 1; pk >= (wt_[i].persist ? 1 : 0); pk--) { /* the persistent kernel: packed X only */
                tpacked[ntile] = pk;
                tiles[ntile++] = wt_[i];
            }
    char  table[64][200];
    int   nt = 0;
    /* ev[0..reps]: queued timing records an event between consecutive launches */
    cudaEvent_t *ev = (cudaEvent_t *)malloc(sizeof(cudaEvent_t) * (reps + 1));
    for (int i = 0; i <= reps; i++) CK(cudaEventCreate(&ev[i]));
    float *t = (float *)malloc(sizeof(float) * reps);
    uint32_t *sink;
    CK(cudaMalloc((void **)&sink, 4));
    { /* the interval of an empty launch, queued: the device-side gap between two launches */
        for (int r = 0; r < 3; r++) empty_kernel<<<132, 128>>>();
        CK(cudaEventRecord(ev[0]));
        for (int r = 0; r < reps; r++) {
            empty_kernel<<<132, 128>>>();
            CK(cudaEventRecord(ev[r + 1]));
        }
        CK(cudaEventSynchronize(ev[reps]));
        for (int r = 0; r < reps; r++) CK(cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]));
        qsort(t, reps, sizeof(float), cmp_f);
        printf("# empty kernel (132 x 128 threads), queued interval %.2f us\n", t[reps / 2] * 1e3);
    }
    for (size_t si = 0; si < nshapes; si++) {
        const shape *s = &shapes[si];
        if (only_shape && strcmp(only_shape, s->name)) continue;
        fm_cuda_weights wset[2] = {}, &w = wset[0]; /* two weight sets, alternated launch by launch */
        w.fmt = oss ? FM_FORMAT_MXFP4 : FM_FORMAT_NVFP4; /* the prepacked layout is the same; the scale code's meaning differs */
        w.n_experts = s->E;
        w.n = s->N;
        w.k = s->K;
        w.kp = (s->K + 63) / 64 * 64;
        fm_cuda_prepack_sizes(s->N, s->K, &w.data_bytes, &w.scale_bytes);
        CK(cudaMalloc(&w.d_data, w.data_bytes * s->E));
        CK(cudaMalloc(&w.d_scale, w.scale_bytes * s->E));
        CK(cudaMalloc((void **)&w.d_oscale, sizeof(float) * s->E));
        fill_random<<<1024, 256>>>((uint32_t *)w.d_data, w.data_bytes * s->E / 4, 1234u + si, 0xFFFFFFFFu, 0, 0);
        fill_random<<<1024, 256>>>((uint32_t *)w.d_scale, w.scale_bytes * s->E / 4, 99u + si, 0xFFFFFFFFu, 40, 60);
        wset[1] = w;
        CK(cudaMalloc(&wset[1].d_data, w.data_bytes * s->E));
        CK(cudaMalloc(&wset[1].d_scale, w.scale_bytes * s->E));
        fill_random<<<1024, 256>>>((uint32_t *)wset[1].d_data, w.data_bytes * s->E / 4, 5678u + si, 0xFFFFFFFFu, 0, 0);
        fill_random<<<1024, 256>>>((uint32_t *)wset[1].d_scale, w.scale_bytes * s->E / 4, 77u + si, 0xFFFFFFFFu, 40, 60);
        { /* same-size read reference: the weight set's data + scale bytes, sets alternated, queued */
            size_t nd = w.data_bytes * s->E / 16, ns = w.scale_bytes * s->E / 16;
            int    g = prop.multiProcessorCount * 8;
            for (int r = 0; r < 3 + reps; r++) {
                if (r == 3) CK(cudaEventRecord(ev[0]));
                read_ref<<<g, 256>>>((const uint4 *)wset[r & 1].d_data, nd, (const uint4 *)wset[r & 1].d_scale, ns, sink);
                if (r >= 3) CK(cudaEventRecord(ev[r - 2]));
            }
            CK(cudaEventSynchronize(ev[reps]));
            for (int r = 0; r < reps; r++) CK(cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]));
            qsort(t, reps, sizeof(float), cmp_f);
            double rb = (double)(w.data_bytes + w.scale_bytes) * s->E;
            printf("# read,%s,%.0f,%.2f   (same-size read of the weight set: %.3f TB/s)\n", s->name, rb, t[reps / 2] * 1e3,
                   rb / (t[reps / 2] * 1e-3) / 1e12);
        }
        float *hos = (float *)malloc(sizeof(float) * s->E);
        for (int e = 0; e < s->E; e++) hos[e] = 1e-3f;
        CK(cudaMemcpy(w.d_oscale, hos, sizeof(float) * s->E, cudaMemcpyHostToDevice));
        free(hos);
        int     maxm = ms[nms - 1];
        size_t  xrows = (size_t)maxm * s->E;
        uint16_t *x[2], *y;
        for (int b = 0; b < 2; b++) {
            CK(cudaMalloc((void **)&x[b], xrows * s->K * 2));
            fill_bf16<<<1024, 256>>>(x[b], xrows * s->K, 7u + b);
        }
        CK(cudaMalloc((void **)&y, xrows * s->N * 2));
        float   *scratch = NULL, *yf = NULL, *rwt = NULL;
        int32_t *slots = NULL;
        if (fdet) {
            size_t fr = 0; /* rows of the largest point whose scratch fits */
            for (int mi = 0; mi < nms; mi++)
                if ((double)ms[mi] * s->E * s->N * 4 <= 2.2e9) fr = (size_t)ms[mi] * s->E;
            if (!fr) fr = 8;
            CK(cudaMalloc((void **)&scratch, fr * s->N * 4));
            CK(cudaMalloc((void **)&yf, (fr / 8 + 1) * s->N * 4));
            CK(cudaMalloc((void **)&rwt, fr * 4));
            CK(cudaMalloc((void **)&slots, fr * 4));
            float   *h = (float *)malloc(fr * 4);
            int32_t *hs = (int32_t *)malloc(fr * 4);
            for (size_t r = 0; r < fr; r++) h[r] = 0.125f, hs[r] = (int32_t)r;
            CK(cudaMemcpy(rwt, h, fr * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(slots, hs, fr * 4, cudaMemcpyHostToDevice));
            free(h);
            free(hs);
        }
        int32_t *offs, *hoff = (int32_t *)malloc(sizeof(int32_t) * (s->E + 1));
        CK(cudaMalloc((void **)&offs, sizeof(int32_t) * (s->E + 1)));
        CK(cudaGetLastError());
        /* Median time of one launch, -1 if the tile has no multi-block kernel for a.feature_blocks.
         * queued (the figures): 3 warm-up launches, then reps launches enqueued back to back with
         * an event between consecutive ones, so each interval is one kernel on the GPU plus the
         * device-side gap between two launches, not the host's launch path (the host enqueues
         * ahead of the GPU: fm_cuda_gemm's checks and the launch take a few us, every kernel
         * here takes 50+ us). single (the earlier sections' method): event, launch, event,
         * synchronize, one launch at a time: the host path of each launch is inside the time.
         * Both alternate the two weight sets (2 x 0.2-0.45 GB) and the two X buffers, so no
         * launch finds its weights in the 60 MB L2. */
        auto time_gemm = [&](fm_cuda_gemm_args a, int queued) -> double {
            auto launch = [&](int r) -> int {
                a.x = x[r & 1];
                a.w = &wset[r & 1];
                fm_status st = fm_cuda_gemm(&a);
                if (st == FM_ERR_UNSUPPORTED && a.feature_blocks > 1) return 1; /* no multi-block kernel */
                if (st != FM_OK) {
                    fprintf(stderr, "fm_cuda_gemm: %s\n", fm_last_error());
                    exit(1);
                }
                return 0;
            };
            for (int r = 0; r < 3; r++)
                if (launch(r)) {
                    CK(cudaDeviceSynchronize());
                    return -1;
                }
            CK(cudaDeviceSynchronize());
            if (queued) {
                CK(cudaEventRecord(ev[0]));
                for (int r = 0; r < reps; r++) {
                    launch(r);
                    CK(cudaEventRecord(ev[r + 1]));
                }
                CK(cudaEventSynchronize(ev[reps]));
                for (int r = 0; r < reps; r++) CK(cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]));
            } else {
                for (int r = 0; r < reps; r++) {
                    CK(cudaEventRecord(ev[0]));
                    launch(r);
                    CK(cudaEventRecord(ev[1]));
                    CK(cudaEventSynchronize(ev[1]));
                    CK(cudaEventElapsedTime(&t[r], ev[0], ev[1]));
                }
            }
            CK(cudaGetLastError());
            qsort(t, reps, sizeof(float), cmp_f);
            return t[reps / 2] * 1e3;
        };
        /* Chained: CHAIN launches back to back with no event between them (an event
         * record between two kernels also ends a programmatic overlap), time / CHAIN,
         * median of 9 chains: what one GEMM costs in a stream of GEMMs, as in a layer's
         * FC1 -> FC2 or a graph of layers; pdl = 1 launches each with PDL */
        /* Three ways of launching the same GEMM, interleaved round by round so that the
         * GPU's clock drift over a run (it warms up: a point measured later reads slower)
         * falls on all three alike: per round, CHAIN launches (a) queued with an event
         * between each two, (b) chained back to back with no event between them (an event
         * record between two kernels also ends a programmatic overlap), (c) chained with
         * PDL (fm_cuda_gemm_args.pdl); each = its total / CHAIN; 9 rounds after a warm-up
         * one; out[0..2] = medians, out[3..8] = min/max of each. */
        auto time_modes = [&](fm_cuda_gemm_args a, double *out) {
            const int CHAIN = 20, ROUNDS = 9;
            float     tm[3][ROUNDS];
            for (int c = -1; c < ROUNDS; c++)
                for (int mode = 0; mode < 3; mode++) {
                    a.pdl = mode == 2;
                    CK(cudaEventRecord(ev[0]));
                    for (int r = 0; r < CHAIN; r++) {
                        a.x = x[r & 1];
                        a.w = &wset[r & 1];
                        if (fm_cuda_gemm(&a) != FM_OK) {
                            fprintf(stderr, "fm_cuda_gemm: %s\n", fm_last_error());
                            exit(1);
                        }
                        if (mode == 0 && r + 1 < CHAIN) CK(cudaEventRecord(ev[1]));
                    }
                    CK(cudaEventRecord(ev[2]));
                    CK(cudaEventSynchronize(ev[2]));
                    if (c >= 0) CK(cudaEventElapsedTime(&tm[mode][c], ev[0], ev[2]));
                }
            for (int mode = 0; mode < 3; mode++) {
                qsort(tm[mode], ROUNDS, sizeof(float), cmp_f);
                out[mode] = tm[mode][ROUNDS / 2] * 1e3 / CHAIN;
                out[3 + 2 * mode] = tm[mode][0] * 1e3 / CHAIN;
                out[4 + 2 * mode] = tm[mode][ROUNDS - 1] * 1e3 / CHAIN;
            }
        };
        for (int mi = 0; mi < nms; mi++) {
            int m = ms[mi];
            if (only_m && m != only_m) continue;
            if (fdet && (double)m * s->E * s->N * 4 > 2.2e9) continue;
            for (int e = 0; e <= s->E; e++) hoff[e] = e * m;
            CK(cudaMemcpy(offs, hoff, sizeof(int32_t) * (s->E + 1), cudaMemcpyHostToDevice));
            double bytes = (double)s->E * s->N * s->K * (0.5 + (oss ? 1.0 / 32 : 1.0 / 16)) + /* MXFP4: a UE8M0 byte per 32 */ (double)m * s->E * (s->K + s->N) * 2.0;
            double flops = 2.0 * m * s->E * (double)s->N * s->K;
            double floor_us = bytes / (bw * 1e12) * 1e6;
            if (bf16_tflops > 0 && flops / (bf16_tflops * 1e12) * 1e6 > floor_us) floor_us = flops / (bf16_tflops * 1e12) * 1e6;
            /* the launcher's choices (the planner's first candidates): natural X and packed X */
            fm_tile def = {}, defp = {};
            int     def_nb = 1, have_defp = 0;
            {
                fm_cuda_gemm_args q = {};
                q.w = &w;
                q.epi = fdet ? FM_CUDA_EPI_FINALIZE_DET : FM_CUDA_EPI_NONE;
                q.expected_rows = m;
                if (fm_cuda_gemm_choose(&q, &def, &def_nb, NULL, NULL) != FM_OK) {
                    fprintf(stderr, "fm_cuda_gemm_choose: %s\n", fm_last_error());
                    exit(1);
                }
                q.x_packed = 1;
                have_defp = prop.major == 9 && prop.minor == 0 && fm_cuda_gemm_choose(&q, &defp, NULL, NULL, NULL) == FM_OK;
            }
            double best = 1e30, def_us = 0, defp_us = 0;
            char   best_name[64] = "";
            fm_tile           best_tl = {};
            fm_cuda_gemm_args best_a = {};
            for (size_t ti = 0; ti < ntile; ti++) {
                fm_tile tl = tiles[ti];
                int     wg = tl.family == FM_FAMILY_FP4MOE_WGMMA;
                /* automatic = several blocks per CTA at short K, one at long K: the other choice as a variant */
                if (tnb1[ti]) tnb1[ti] = s->K > 512 ? 4 : 1;
                /* the feature blocks this row runs with: explicit, or the automatic count for a given tile */
                int vnb = tnb1[ti];
                if (!vnb) {
                    vnb = !wg && fm_mma_tile_has_mb(&tl)
                              ? fm_plan_fp4moe_auto_blocks(tl.warps, tl.mt, 0, s->N, s->K, s->E, prop.multiProcessorCount)
                              : 1;
                }
                /* default column: 1 = the launcher's natural-X choice, 2 = its packed-X choice */
                int is_def = fm_tile_equal(&tl, &def) && !tpacked[ti] && vnb == def_nb
                                 ? 1
                                 : (have_defp && fm_tile_equal(&tl, &defp) && tpacked[ti] ? 2 : 0);
                if (!is_def && m > 64 * tl.nt) continue; /* a tile of 8*nt rows re-streams the weights m/(8 nt) times */
                if (!is_def && wg && 8 * tl.nt > (8 * m > 32 ? 8 * m : 32))
                    continue; /* mostly padding tokens */
                char nm[64];
                {
                    fm_tile_name(&tl, nm, sizeof nm); /* the catalogue's rows: the family set */
                    if (wg && !tpacked[ti]) strcat(nm, "_natx");
                    if (tnb1[ti]) strcat(nm, tnb1[ti] == 1 ? "_nb1" : "_nb4");
                }
                if (only_tile && strcmp(only_tile, nm)) continue;
                fm_cuda_gemm_args a = {};
                a.w = &w;
                a.offsets = offs;
                a.max_rows = m * s->E; /* the rows of this call: the wgmma grid is sized by it */
                a.epi = FM_CUDA_EPI_NONE;
                a.y = y;
                if (fdet) {
                    a.epi = FM_CUDA_EPI_FINALIZE_DET;
                    a.y = yf;
                    a.scratch = scratch;
                    a.row_weight = rwt;
                    a.token_slots = slots;
                    a.top_k = 8;
                    a.n_tokens = m * s->E / 8;
                }
                a.tile = &tl;
                a.x_packed = tpacked[ti]; /* random X: the column order changes nothing in the timing */
                a.feature_blocks = tnb1[ti];
                double us = time_gemm(a, 1);
                if (us < 0) continue; /* no multi-block kernel for this tile */
                if (timeline && !wg) { /* probe build: 4 queued launches, every CTA */
                    unsigned            cap = (unsigned)(s->E * (s->N / 16));
                    size_t              tb = (size_t)4 * cap * 3 * 8;
                    unsigned long long *dtl, *htl = (unsigned long long *)malloc(tb);
                    CK(cudaMalloc((void **)&dtl, tb));
                    CK(cudaMemset(dtl, 0, tb));
                    if (fm_mma_probe_timeline(dtl, cap) != 0) {
                        fprintf(stderr, "--timeline needs a probe build (cmake -DFM_PROBE_TIMELINE=ON)\n");
                        exit(1);
                    }
                    CK(cudaEventRecord(ev[0]));
                    for (int r = 0; r < 4; r++) {
                        a.x = x[r & 1];
                        a.w = &wset[r & 1];
                        a.pdl = tl_pdl == 1;
                        if (fm_cuda_gemm(&a) != FM_OK) exit(1);
                        if (!tl_pdl || r == 3) CK(cudaEventRecord(ev[r + 1]));
                    }
                    a.pdl = 0;
                    CK(cudaEventSynchronize(ev[4]));
                    CK(cudaMemcpy(htl, dtl, tb, cudaMemcpyDeviceToHost));
                    CK(fm_mma_probe_timeline(NULL, 0) == 0 ? cudaSuccess : cudaErrorUnknown);
                    FILE *f = fopen(timeline, "w");
                    if (!f) exit(1);
                    fprintf(f, "# %s m=%d %s, events (us):", s->name, m, nm);
                    for (int r = 0; r < 4; r++) {
                        float ms_;
                        if (tl_pdl && r < 3) continue;
                        CK(cudaEventElapsedTime(&ms_, ev[tl_pdl ? 0 : r], ev[r + 1]));
                        fprintf(f, " %.2f%s", ms_ * 1e3, tl_pdl == 1 ? " (4 launches, PDL)" : tl_pdl ? " (4 launches, chained)" : "");
                    }
                    fprintf(f, "\n");
                    fm_probe_tl_write(f, htl, cap);
                    fclose(f);
                    free(htl);
                    CK(cudaFree(dtl));
                }
                printf("%s,%s,%d,%s,%d,%.2f,%.3f,%.1f,%.2f\n", fdet ? "csvf" : "csv", s->name, m, nm, is_def, us, bytes / (us * 1e-6) / 1e12,
                       flops / (us * 1e-6) / 1e12, floor_us);
                if (is_def == 1) def_us = us;
                if (is_def == 2) defp_us = us;
                if (us < best) {
                    best = us;
                    snprintf(best_name, sizeof best_name, "%s", nm);
                    best_tl = tl;
                    best_a = a;
                }
            }
            if (best < 1e30 && !fdet) { /* the same tile timed the old way: one launch at a time, host path included */
                best_a.tile = &best_tl;
                double us1 = time_gemm(best_a, 0);
                printf("csvs,%s,%d,%s,%.2f\n", s->name, m, best_name, us1);
                /* interleaved: csvc,<shape>,<rows>,<tile>,<queued>,<chained>,<chained+PDL>, then min,max of each */
                double md[9];
                if (reps >= 5) time_modes(best_a, md); /* (--reps < 5: a profiler run, one launch of interest) */
                if (reps >= 5) printf("csvc,%s,%d,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n", s->name, m, best_name, md[0], md[1],
                       md[2], md[3], md[4], md[5], md[6], md[7], md[8]);
            }
            if (nt < 64)
                snprintf(table[nt++], 200, "%-8s %5d %9.1f %9.1f %9.1f %-22s %7.3f %7.1f %8.1f %6.2f", s->name, m,
                         def_us, defp_us, best, best_name, bytes / (best * 1e-6) / 1e12, flops / (best * 1e-6) / 1e12, floor_us,
                         best / floor_us);
        }
        CK(cudaFree(w.d_data));
        CK(cudaFree(w.d_scale));
        CK(cudaFree(wset[1].d_data));
        CK(cudaFree(wset[1].d_scale));
        CK(cudaFree(w.d_oscale));
        CK(cudaFree(x[0]));
        CK(cudaFree(x[1]));
        CK(cudaFree(y));
        CK(cudaFree(offs));
        cudaFree(scratch);
        cudaFree(yf);
        cudaFree(rwt);
        cudaFree(slots);
        free(hoff);
    }
    printf("\n%-8s %5s %9s %9s %9s %-22s %7s %7s %8s %6s\n", "shape", "m/exp", "def_us", "defpk_us", "best_us", "best_tile", "TB/s",
           "TFLOP/s", "floor_us", "x_floor");
    for (int i = 0; i < nt; i++) printf("%s\n", table[i]);
    free(t);
    return 0;
}
