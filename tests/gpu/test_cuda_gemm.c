/* test_cuda_gemm.c - the grouped GEMM (both kernel families: mma.sync "mma"
 * and, on compute capability 9.0, "wgmma") against an FP64 reference built from
 * fm_dequantize: every compiled tile, both formats, every epilogue; zero-row
 * experts, row counts that are not multiples of the tile, K a multiple of the
 * block but not of the kernel's 64, skewed routing and all rows on one expert.
 * Fresh random inputs per run (seed printed), outputs poisoned, NaN/Inf first.
 *
 * Bounds: the kernel's BF16 weights are exact (E2M1 x scale has <= 6 significant
 * bits) and the BF16 inputs are those of the reference, so only the FP32
 * accumulation order differs (~1e-12) plus, for BF16 outputs, one rounding to
 * BF16 (relative 2^-9, NMSE ~1e-6): 2e-5 for BF16 outputs, 1e-9 for FP32. A
 * flushed subnormal (the codes +-0.5) or a wrong scale gives NMSE >= 1e-3. */
#include <math.h>

#include "gpu_common.h"

#include "cuda/cuda_internal.h"
#include "fp4moe/plan.h"
#include "kernels/fm_kernels_smem.h"

typedef struct {
    int E, N, K;
    int counts[16];
} gcase;

static int device_is_sm90(void)
{
    int dev = 0, major = 0, minor = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
}

/* Every compiled tile of both families (wgmma only where it runs), in list order. */
static size_t all_tiles(fm_tile *out, size_t cap)
{
    size_t n = 0, nm = 0, nw = 0;
    const fm_tile *m = fm_mma_tiles(&nm), *w = fm_wgmma_tiles(&nw);
    for (size_t i = 0; i < nm && n < cap; i++) out[n++] = m[i];
    if (device_is_sm90())
        for (size_t i = 0; i < nw && n < cap; i++) out[n++] = w[i];
    return n;
}

static int is_wgmma(const fm_tile *t) { return t->family == FM_FAMILY_FP4MOE_WGMMA; }

static char *tile_name(const fm_tile *t, char *buf, size_t n)
{
    return is_wgmma(t) ? fm_wgmma_tile_name(t, buf, n) : fm_mma_tile_name(t, buf, n);
}

static fm_status tile_smem(const fm_tile *t, fm_smem_breakdown *bd)
{
    return is_wgmma(t) ? fm_smem_wgmma(t, bd) : fm_smem_mma(t, bd);
}

/* X layout for the wgmma tiles: 1 = packed (fm_cuda_kpack_col order, the fast
 * kernel) whenever K % 64 == 0, 0 = natural. y_packed: the BF16 output is
 * written packed and unpacked here before the comparison. */
static int g_x_packed = 1, g_y_packed = 0;
/* feature_blocks of every launch (0 = automatic) */
static int g_blocks = 0;
/* BF16 outputs written g_y_off bytes past a 256-byte aligned allocation (2: not
 * 16-byte aligned, so the staged epilogue's 16-byte stores must not be used) */
static int g_y_off = 0;
/* launch with programmatic dependent launch (args.pdl; the dependent chains are in test_cuda_pdl) */
static int g_pdl = 0;
/* k_splits of every launch (> 1: a zero-filled split_ws of the size asked; after the
 * check the launch runs again and must give the same bits, and every counter must be
 * back at zero); g_ksplit_ws_less: that many bytes short (the refusal) */
static int    g_ksplit = 0;
static size_t g_ksplit_ws_less = 0;
/* expert_list (the experts with rows, ascending) with expert_slots = g_slots; g_list_all:
 * every expert listed, with or without rows */
static int g_list = 0, g_slots = 0, g_list_all = 0;

/* Returns the status of fm_cuda_gemm; on FM_OK the result has been checked, on
 * FM_ERR_SMEM_EXCEEDED the poisoned output must be untouched (checked here). */
static fm_status run_case_limit(fm_rng *r, fm_format f, const gcase *c, const fm_tile *tile, fm_cuda_epilogue epi,
                                size_t smem_limit)
{
    fm_status ret = FM_OK;
    gpu_experts w;
    gpu_experts_make(&w, r, f, c->E, c->N, c->K);
    int32_t offsets[17] = {0};
    for (int e = 0; e < c->E; e++) offsets[e + 1] = offsets[e] + c->counts[e];
    const int rows = offsets[c->E], K = c->K, N = c->N;
    uint16_t *xh = malloc(sizeof(uint16_t) * (size_t)(rows ? rows : 1) * K);
    float    *xf = malloc(sizeof(float) * (size_t)(rows ? rows : 1) * K);
    for (size_t i = 0; i < (size_t)rows * K; i++) {
        xh[i] = fm_bf16_encode(fm_rng_normal(r));
        xf[i] = fm_bf16_decode(xh[i]);
    }
    double *ref = malloc(sizeof(double) * (size_t)(rows ? rows : 1) * N);
    gpu_ref_gemm(&w, offsets, xf, ref);

    fm_cuda_weights *cw = NULL;
    assert_int_equal(fm_cuda_weights_create(w.w, c->E, &cw), FM_OK);
    int pack = tile && is_wgmma(tile) && K % 64 == 0 && g_x_packed;
    if (pack) { /* the caller's job: X columns in the prepack K order */
        uint16_t *xp = malloc(sizeof(uint16_t) * (size_t)(rows ? rows : 1) * K);
        for (int rr = 0; rr < rows; rr++)
            for (int k = 0; k < K; k++) xp[(size_t)rr * K + fm_cuda_kpack_col(k)] = xh[(size_t)rr * K + k];
        memcpy(xh, xp, sizeof(uint16_t) * (size_t)rows * K);
        free(xp);
    }
    void *dx = dev_upload(xh, sizeof(uint16_t) * (size_t)rows * K);
    void *doff = dev_upload(offsets, sizeof(int32_t) * (c->E + 1));
    fm_cuda_gemm_args a = {.w = cw, .x = dx, .offsets = doff, .max_rows = rows, .epi = epi, .tile = tile,
                           .expected_rows = 4, .smem_limit = smem_limit, .x_packed = pack,
                           .feature_blocks = g_blocks, .pdl = g_pdl, .k_splits = g_ksplit};
    void *dlist = NULL;
    if (g_list) {
        int32_t list[17] = {0};
        for (int e = 0; e < c->E; e++)
            if (g_list_all || c->counts[e] > 0) list[1 + list[0]++] = e;
        dlist = dev_upload(list, sizeof(int32_t) * (c->E + 1));
        a.expert_list = dlist;
        a.expert_slots = g_slots;
    }
    void  *dsplit = NULL;
    size_t split_bytes = fm_cuda_gemm_split_ws_bytes(cw, rows, g_ksplit);
    if (split_bytes) {
        CK(cudaMalloc(&dsplit, split_bytes));
        CK(cudaMemset(dsplit, 0, split_bytes));
        a.split_ws = dsplit;
        a.split_ws_bytes = split_bytes - g_ksplit_ws_less;
    }
    char   what[160], name[64];
    if (tile) {
        tile_name(tile, name, sizeof name);
    } else {
        snprintf(name, sizeof name, "default(limit %zu)", smem_limit);
        a.expected_rows = 64;
    }
    snprintf(what, sizeof what, "%s %s epi=%d E=%d N=%d K=%d rows=%d%s%s blocks=%d%s%s k_splits=%d list=%d/%d",
             fm_format_traits_get(f)->name, name, (int)epi, c->E, N, K, rows, pack ? " x_packed" : "",
             g_y_packed ? " y_packed" : "", g_blocks, g_y_off ? " y+2" : "", g_pdl ? " pdl" : "", g_ksplit, g_list,
             g_slots);

    if (epi == FM_CUDA_EPI_NONE || epi == FM_CUDA_EPI_SWIGLU) {
        int       ny = epi == FM_CUDA_EPI_SWIGLU ? N / 2 : N;
        size_t    ne = (size_t)rows * ny;
        uint16_t *yh = malloc(sizeof(uint16_t) * (ne ? ne : 1));
        fm_poison_bytes(yh, sizeof(uint16_t) * ne); /* 0xA5A5: a finite BF16, caught by the error bound */
        void *dbuf = NULL;
        CK(cudaMalloc(&dbuf, sizeof(uint16_t) * ne + 16));
        void *dy = (char *)dbuf + g_y_off;
        CK(cudaMemcpy(dy, yh, sizeof(uint16_t) * ne, cudaMemcpyHostToDevice));
        a.y = dy;
        a.y_packed = g_y_packed;
        ret = fm_cuda_gemm(&a);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(yh, dy, sizeof(uint16_t) * ne, cudaMemcpyDeviceToHost));
        if (ret == FM_OK && g_y_packed) { /* back to natural column order */
            uint16_t *yn = malloc(sizeof(uint16_t) * (ne ? ne : 1));
            for (int rr = 0; rr < rows; rr++)
                for (int n = 0; n < ny; n++) yn[(size_t)rr * ny + n] = yh[(size_t)rr * ny + fm_cuda_kpack_col(n)];
            memcpy(yh, yn, sizeof(uint16_t) * ne);
            free(yn);
        }
        if (ret != FM_OK) { /* refused: nothing may have been written */
            for (size_t i = 0; i < ne; i++) assert_int_equal(yh[i], 0xA5A5);
            ne = 0;
        }
        float *got = malloc(sizeof(float) * (ne ? ne : 1)), *want = malloc(sizeof(float) * (ne ? ne : 1));
        for (int rr = 0; rr < (ne ? rows : 0); rr++)
            for (int n = 0; n < ny; n++) {
                size_t i = (size_t)rr * ny + n;
                got[i] = fm_bf16_decode(yh[i]);
                if (epi == FM_CUDA_EPI_NONE) {
                    want[i] = (float)ref[(size_t)rr * N + n];
                } else {
                    double g = ref[(size_t)rr * N + n], u = ref[(size_t)rr * N + n + ny];
                    want[i] = (float)(g / (1.0 + exp(-g)) * u);
                }
            }
        fm_assert_close(got, want, ne, 2e-5, what);
        if (ret == FM_OK && dsplit && ne) { /* split K: the same bits again (the counters were reset) */
            uint16_t *y2 = malloc(sizeof(uint16_t) * ne);
            CK(cudaMemset(dy, 0xA5, sizeof(uint16_t) * ne));
            assert_int_equal(fm_cuda_gemm(&a), FM_OK);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y2, dy, sizeof(uint16_t) * ne, cudaMemcpyDeviceToHost));
            if (g_y_packed) { /* the first copy was unpacked above: compare packed with packed */
                for (int rr = 0; rr < rows; rr++)
                    for (int n = 0; n < ny; n++)
                        assert_int_equal(y2[(size_t)rr * ny + fm_cuda_kpack_col(n)], yh[(size_t)rr * ny + n]);
            } else
                assert_memory_equal(y2, yh, sizeof(uint16_t) * ne);
            free(y2);
        }
        free(got);
        free(want);
        free(yh);
        CK(cudaFree(dbuf));
    } else {
        /* finalize: T tokens, row r belongs to token r % T with weight w_r */
        int      T = rows > 3 ? rows / 3 : 1, top_k = 0;
        int32_t *tok = malloc(sizeof(int32_t) * (rows ? rows : 1));
        float   *rw = malloc(sizeof(float) * (rows ? rows : 1));
        int     *per = calloc((size_t)T, sizeof(int));
        for (int rr = 0; rr < rows; rr++) {
            tok[rr] = rr % T;
            rw[rr] = (float)fm_rng_uniform(r);
            if (++per[tok[rr]] > top_k) top_k = per[tok[rr]];
        }
        int32_t *slots = malloc(sizeof(int32_t) * (size_t)T * (top_k ? top_k : 1));
        for (int i = 0; i < T * top_k; i++) slots[i] = -1; /* tokens with fewer rows: empty slots */
        memset(per, 0, sizeof(int) * T);
        for (int rr = 0; rr < rows; rr++) slots[tok[rr] * top_k + per[tok[rr]]++] = rr;
        float *base = malloc(sizeof(float) * (size_t)T * N), *want = malloc(sizeof(float) * (size_t)T * N);
        fm_rng_fill_normal(r, base, (size_t)T * N, 1.0f); /* out += ...: start from non-zero values */
        for (size_t i = 0; i < (size_t)T * N; i++) want[i] = base[i];
        for (int rr = 0; rr < rows; rr++)
            for (int n = 0; n < N; n++) want[(size_t)tok[rr] * N + n] += (float)(rw[rr] * ref[(size_t)rr * N + n]);
        void *dy = dev_upload(base, sizeof(float) * (size_t)T * N);
        void *dtok = dev_upload(tok, sizeof(int32_t) * rows), *drw = dev_upload(rw, sizeof(float) * rows);
        void *dslots = dev_upload(slots, sizeof(int32_t) * (size_t)T * top_k);
        void *dscr = NULL;
        CK(cudaMalloc(&dscr, sizeof(float) * (size_t)(rows ? rows : 1) * N));
        a.y = dy;
        a.row_token = dtok;
        a.row_weight = drw;
        a.n_tokens = T;
        a.top_k = top_k ? top_k : 1;
        a.token_slots = dslots;
        a.scratch = dscr;
        ret = fm_cuda_gemm(&a);
        assert_int_equal(ret, FM_OK);
        CK(cudaDeviceSynchronize());
        float *got = malloc(sizeof(float) * (size_t)T * N);
        CK(cudaMemcpy(got, dy, sizeof(float) * (size_t)T * N, cudaMemcpyDeviceToHost));
        fm_assert_close(got, want, (size_t)T * N, 1e-9, what);
        if (epi == FM_CUDA_EPI_FINALIZE_DET) { /* bitwise the same on a second run */
            float *got2 = malloc(sizeof(float) * (size_t)T * N);
            CK(cudaMemcpy(dy, base, sizeof(float) * (size_t)T * N, cudaMemcpyHostToDevice));
            assert_int_equal(fm_cuda_gemm(&a), FM_OK);
            CK(cudaMemcpy(got2, dy, sizeof(float) * (size_t)T * N, cudaMemcpyDeviceToHost));
            assert_memory_equal(got, got2, sizeof(float) * (size_t)T * N);
            free(got2);
        }
        free(got);
        free(tok);
        free(rw);
        free(per);
        free(slots);
        free(base);
        free(want);
        CK(cudaFree(dy));
        CK(cudaFree(dtok));
        CK(cudaFree(drw));
        CK(cudaFree(dslots));
        CK(cudaFree(dscr));
    }
    if (dlist) CK(cudaFree(dlist));
    if (dsplit) { /* every arrival counter back at zero */
        size_t cb = fm_cuda_split_counter_bytes(cw, rows);
        int   *cnt = malloc(cb);
        CK(cudaMemcpy(cnt, dsplit, cb, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < cb / sizeof(int); i++) assert_int_equal(cnt[i], 0);
        free(cnt);
        CK(cudaFree(dsplit));
    }
    CK(cudaFree(dx));
    CK(cudaFree(doff));
    fm_cuda_weights_destroy(cw);
    free(xh);
    free(xf);
    free(ref);
    gpu_experts_free(&w);
    return ret;
}

/* Runs and checks one case; the persistent kernel reads packed X only, so with
 * natural X (K % 64 != 0, or g_x_packed = 0) it must refuse, output untouched. */
static void run_case(fm_rng *r, fm_format f, const gcase *c, const fm_tile *tile, fm_cuda_epilogue epi)
{
    int natural_x = !g_x_packed || c->K % 64;
    int refused = tile && is_wgmma(tile) && tile->persist && natural_x;
    assert_int_equal(run_case_limit(r, f, c, tile, epi, 0), refused ? FM_ERR_UNSUPPORTED : FM_OK);
}

/* zero-row experts, counts off the tile, K = 16 (mod 64) for NVFP4 / 32 for MXFP4 */
static const gcase k_mixed = {5, 64, 208, {0, 1, 9, 0, 37}};
static const gcase k_mixed_mx = {5, 64, 224, {3, 0, 17, 70, 0}};
static const gcase k_one_expert = {4, 96, 320, {0, 0, 75, 0}}; /* all rows on one expert */
static const gcase k_skewed = {8, 64, 128, {1, 0, 2, 0, 0, 30, 1, 0}};
/* several passes of the widest tiles (256 tokens), two 256-feature blocks, a K tail
 * stage for kc = 256 (K = 448 = 7 chunks of 64) */
static const gcase k_big = {4, 512, 448, {300, 0, 130, 513}};

/* FM_QUICK=1 (the racecheck run: the sanitizer is ~1000x slower) keeps the first,
 * the second and the last tile of the list. */
static int skip_tile(size_t i, size_t n)
{
    const char *q = getenv("FM_QUICK");
    return q && *q == '1' && i > 1 && i + 1 < n;
}

static void test_every_tile_nvfp4(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fm_tile tiles[64];
    size_t  n = all_tiles(tiles, 64);
    for (size_t i = 0; i < n; i++) {
        if (skip_tile(i, n)) continue;
        const fm_tile *t = &tiles[i];
        run_case(&r, FM_FORMAT_NVFP4, &k_mixed, t, FM_CUDA_EPI_NONE);
        if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &k_mixed, t, FM_CUDA_EPI_SWIGLU);
        if (is_wgmma(t) || t->nt == 8) { /* the tiles meant for many rows */
            run_case(&r, FM_FORMAT_NVFP4, &k_big, t, FM_CUDA_EPI_NONE); /* wgmma: packed X */
            if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &k_big, t, FM_CUDA_EPI_SWIGLU);
        }
        if (is_wgmma(t)) { /* the natural-X wgmma kernel (persistent: refused) */
            g_x_packed = 0;
            run_case(&r, FM_FORMAT_NVFP4, &k_big, t, FM_CUDA_EPI_NONE);
            g_x_packed = 1;
        }
    }
}

static void test_every_tile_mxfp4(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 1);
    fm_tile tiles[64];
    size_t  n = all_tiles(tiles, 64);
    g_pdl = 1; /* (the NVFP4 test runs them plain) */
    for (size_t i = 0; i < n; i++) {
        if (skip_tile(i, n)) continue;
        run_case(&r, FM_FORMAT_MXFP4, &k_mixed_mx, &tiles[i], FM_CUDA_EPI_NONE);
    }
    g_pdl = 0;
}

/* The wgmma family with the FC2 epilogues, skewed routing and all rows on one expert. */
static void test_wgmma_epilogues(void **state)
{
    (void)state;
    if (!device_is_sm90()) {
        printf("  (not compute capability 9.0: wgmma tiles are refused there, checked in test_statuses)\n");
        return;
    }
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 6);
    fm_tile big = {8, 2, 16, 64, 4, 0, FM_FAMILY_FP4MOE_WGMMA}, wide = {8, 1, 32, 64, 4, 0, FM_FAMILY_FP4MOE_WGMMA},
                 mid = {8, 2, 8, 64, 4, 0, FM_FAMILY_FP4MOE_WGMMA};
    run_case(&r, FM_FORMAT_NVFP4, &k_one_expert, &big, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &k_skewed, &mid, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &k_big, &wide, FM_CUDA_EPI_FINALIZE);
    run_case(&r, FM_FORMAT_NVFP4, &k_big, &big, FM_CUDA_EPI_FINALIZE_DET);
    run_case(&r, FM_FORMAT_MXFP4, &k_mixed_mx, &mid, FM_CUDA_EPI_FINALIZE_DET);
    run_case(&r, FM_FORMAT_MXFP4, &k_big, &big, FM_CUDA_EPI_SWIGLU);
    /* packed outputs (FC1 -> FC2 without a repack), from both kernel families */
    static const gcase wide_out = {3, 256, 448, {70, 0, 300}};
    fm_tile mma = {4, 2, 8, 128, 3, 0, FM_FAMILY_FP4MOE_MMA};
    g_y_packed = 1;
    run_case(&r, FM_FORMAT_NVFP4, &wide_out, &big, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &wide_out, &mid, FM_CUDA_EPI_NONE);
    run_case(&r, FM_FORMAT_NVFP4, &wide_out, &mma, FM_CUDA_EPI_SWIGLU);
    /* the natural-X kernel's staged epilogue: packed outputs, SwiGLU */
    g_x_packed = 0;
    run_case(&r, FM_FORMAT_NVFP4, &wide_out, &big, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &wide_out, &wide, FM_CUDA_EPI_NONE);
    g_y_packed = 0;
    run_case(&r, FM_FORMAT_MXFP4, &k_skewed, &mid, FM_CUDA_EPI_SWIGLU);
    g_x_packed = 1;
}

/* The persistent kernel: one CTA per SM loops over tiles blockIdx.x + i x gridDim.x,
 * its stage ring running on across tiles and its output buffer reused, so the
 * cases have more tiles than the device has SMs (N = 4,096: 16-32 feature blocks;
 * 1,123 rows over 8 experts, zero-row ones among them, counts off every tile): each
 * CTA then runs several tiles of different experts, passes and feature blocks. Every
 * epilogue, both formats, packed output, a misaligned output (the register path),
 * and natural X refused with nothing written. FM_QUICK (the sanitizers): the smaller
 * case, the first persistent tile. */
static void test_persistent(void **state)
{
    (void)state;
    if (!device_is_sm90()) {
        printf("  (not compute capability 9.0: no wgmma kernel)\n");
        return;
    }
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 10);
    static const gcase many = {8, 4096, 256, {40, 0, 300, 9, 260, 1, 0, 513}};
    static const gcase many_small = {8, 2048, 128, {40, 0, 300, 9, 260, 1, 0, 130}};
    const int quick = getenv("FM_QUICK") != NULL;
    const gcase *c = quick ? &many_small : &many;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    size_t nw = 0, tested = 0;
    const fm_tile *w = fm_wgmma_tiles(&nw);
    for (size_t i = 0; i < nw; i++) {
        if (!w[i].persist || (quick && tested)) continue;
        fm_tile t = {w[i].warps, w[i].mt, w[i].nt, w[i].kc, w[i].stages, 1, FM_FAMILY_FP4MOE_WGMMA};
        int tok = 8 * t.nt, fs = t.warps * t.mt * 16, ntiles = 0;
        for (int e = 0; e < c->E; e++) ntiles += (c->counts[e] + tok - 1) / tok * (c->N / fs);
        char name[64];
        printf("  %s: %d tiles on %d SMs\n", tile_name(&t, name, sizeof name), ntiles, sms);
        if (!quick) assert_true(ntiles > sms); /* several tiles per CTA */
        run_case(&r, FM_FORMAT_NVFP4, c, &t, FM_CUDA_EPI_NONE);
        run_case(&r, FM_FORMAT_MXFP4, c, &t, FM_CUDA_EPI_NONE);
        if (t.mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, c, &t, FM_CUDA_EPI_SWIGLU);
        run_case(&r, FM_FORMAT_NVFP4, c, &t, FM_CUDA_EPI_FINALIZE_DET);
        if (!quick) run_case(&r, FM_FORMAT_NVFP4, c, &t, FM_CUDA_EPI_FINALIZE);
        g_y_packed = 1;
        run_case(&r, FM_FORMAT_NVFP4, c, &t, t.mt % 2 == 0 ? FM_CUDA_EPI_SWIGLU : FM_CUDA_EPI_NONE);
        g_y_packed = 0;
        g_y_off = 2;
        run_case(&r, FM_FORMAT_NVFP4, c, &t, FM_CUDA_EPI_NONE);
        g_y_off = 0;
        g_x_packed = 0; /* natural X: refused (run_case expects FM_ERR_UNSUPPORTED, output untouched) */
        run_case(&r, FM_FORMAT_NVFP4, &k_skewed, &t, FM_CUDA_EPI_NONE);
        g_x_packed = 1;
        tested++;
    }
    assert_true(tested > 0);
}

/* fm_cuda_x_pack against the host permutation; its statuses; x_packed refused by
 * the mma tiles and for K % 64 != 0. */
static void test_x_pack(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 7);
    const int rows = 37, K = 384;
    uint16_t *xh = malloc(sizeof(uint16_t) * rows * K), *got = malloc(sizeof(uint16_t) * rows * K);
    for (int i = 0; i < rows * K; i++) xh[i] = fm_bf16_encode(fm_rng_normal(&r));
    /* the map is a permutation of each 64-column block */
    int seen[64] = {0};
    for (int c = 0; c < 64; c++) {
        int64_t q = fm_cuda_kpack_col(c);
        assert_true(q >= 0 && q < 64);
        seen[q]++;
        assert_int_equal(fm_cuda_kpack_col(c + 128), q + 128);
    }
    for (int c = 0; c < 64; c++) assert_int_equal(seen[c], 1);
    void *dx = dev_upload(xh, sizeof(uint16_t) * rows * K), *dout = NULL;
    CK(cudaMalloc(&dout, sizeof(uint16_t) * rows * K));
    CK(cudaMemset(dout, 0xA5, sizeof(uint16_t) * rows * K));
    assert_int_equal(fm_cuda_x_pack(dx, dout, rows, K, NULL), FM_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, sizeof(uint16_t) * rows * K, cudaMemcpyDeviceToHost));
    for (int rr = 0; rr < rows; rr++)
        for (int k = 0; k < K; k++)
            assert_int_equal(got[(size_t)rr * K + fm_cuda_kpack_col(k)], xh[(size_t)rr * K + k]);
    assert_int_equal(fm_cuda_x_pack(dx, dout, rows, 96, NULL), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_cuda_x_pack(dx, dx, rows, K, NULL), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_cuda_x_pack((const uint16_t *)((char *)dx + 2), dout, rows, K, NULL), FM_ERR_MISALIGNED);
    assert_int_equal(fm_cuda_x_pack(NULL, dout, rows, K, NULL), FM_ERR_INVALID_ARG);
    /* x_packed with an mma tile, with K % 64 != 0; y_packed with FINALIZE */
    gpu_experts w;
    gpu_experts_make(&w, &r, FM_FORMAT_NVFP4, 2, 64, 64);
    fm_cuda_weights *cw = NULL;
    assert_int_equal(fm_cuda_weights_create(w.w, 2, &cw), FM_OK);
    int32_t off[3] = {0, 1, 2};
    void   *doff = dev_upload(off, sizeof off);
    fm_tile mma = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA};
    fm_cuda_gemm_args a = {.w = cw, .x = dx, .offsets = doff, .max_rows = 2, .y = dout, .tile = &mma, .x_packed = 1};
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED);
    a.x_packed = 0;
    a.y_packed = 1;
    a.epi = FM_CUDA_EPI_FINALIZE; /* FP32 output: no packed order */
    a.row_weight = (const float *)dout;
    a.row_token = (const int32_t *)doff;
    a.n_tokens = 2;
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED);
    fm_cuda_weights_destroy(cw);
    gpu_experts_free(&w);
    gpu_experts_make(&w, &r, FM_FORMAT_NVFP4, 2, 64, 48); /* K = 48 */
    assert_int_equal(fm_cuda_weights_create(w.w, 2, &cw), FM_OK);
    fm_tile wg = {4, 1, 1, 128, 4, 0, FM_FAMILY_FP4MOE_WGMMA};
    a = (fm_cuda_gemm_args){.w = cw, .x = dx, .offsets = doff, .max_rows = 2, .y = dout, .tile = &wg, .x_packed = 1};
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED);
    fm_cuda_weights_destroy(cw);
    gpu_experts_free(&w);
    CK(cudaFree(doff));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    free(xh);
    free(got);
}

static void test_skew_and_finalize(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 2);
    fm_tile small = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA}, mid = {4, 2, 8, 128, 3, 0, FM_FAMILY_FP4MOE_MMA},
            pair = {4, 2, 2, 256, 4, 0, FM_FAMILY_FP4MOE_MMA};
    run_case(&r, FM_FORMAT_NVFP4, &k_one_expert, &small, FM_CUDA_EPI_NONE);
    run_case(&r, FM_FORMAT_NVFP4, &k_one_expert, &mid, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &k_skewed, &pair, FM_CUDA_EPI_SWIGLU);
    run_case(&r, FM_FORMAT_NVFP4, &k_skewed, &small, FM_CUDA_EPI_FINALIZE);
    run_case(&r, FM_FORMAT_NVFP4, &k_mixed, &mid, FM_CUDA_EPI_FINALIZE_DET);
    run_case(&r, FM_FORMAT_MXFP4, &k_mixed_mx, &small, FM_CUDA_EPI_FINALIZE_DET);
}

/* Statuses: a caller's mistake gets its own status and launches nothing. */
static void test_statuses(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 3);
    gpu_experts w;
    gpu_experts_make(&w, &r, FM_FORMAT_NVFP4, 2, 32, 64);
    fm_cuda_weights *cw = NULL;
    assert_int_equal(fm_cuda_weights_create(w.w, 2, &cw), FM_OK);
    int32_t off[3] = {0, 1, 2};
    void   *doff = dev_upload(off, sizeof off), *dx = NULL, *dy = NULL;
    CK(cudaMalloc(&dx, 4096));
    CK(cudaMalloc(&dy, 4096));
    fm_tile           bad = {4, 1, 1, 192, 4, 0, FM_FAMILY_FP4MOE_MMA};
    fm_tile           single = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA};
    fm_cuda_gemm_args a = {.w = cw, .x = dx, .offsets = doff, .max_rows = 2, .y = dy, .tile = &bad};
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED);
    a.tile = &single;
    a.epi = FM_CUDA_EPI_SWIGLU;
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED); /* SwiGLU needs gate/up pairs */
    a.epi = FM_CUDA_EPI_FINALIZE;
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_INVALID_ARG); /* no row_weight / row_token */
    a.epi = FM_CUDA_EPI_NONE;
    a.x = (const uint16_t *)((const char *)dx + 2);
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_MISALIGNED);
    a.x = dx;
    assert_int_equal(fm_cuda_gemm(&a), FM_OK);
    CK(cudaDeviceSynchronize());
    fm_tile wg = {4, 1, 1, 128, 4, 0, FM_FAMILY_FP4MOE_WGMMA}, odd = {4, 1, 1, 256, 4, 0, (fm_kernel_family)7};
    a.tile = &wg; /* wgmma runs on compute capability 9.0 only */
    assert_int_equal(fm_cuda_gemm(&a), device_is_sm90() ? FM_OK : FM_ERR_UNSUPPORTED);
    CK(cudaDeviceSynchronize());
    a.tile = &odd;
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_INVALID_ARG);
    wg.kc = 192; /* not compiled in */
    a.tile = &wg;
    assert_int_equal(fm_cuda_gemm(&a), FM_ERR_UNSUPPORTED);
    /* prepack refuses BF16 and NaN scales */
    fm_qtensor bf = w.w[0];
    bf.fmt = FM_FORMAT_BF16;
    fm_cuda_weights *none = (fm_cuda_weights *)&a;
    assert_int_equal(fm_cuda_weights_create(&bf, 1, &none), FM_ERR_FORMAT);
    assert_null(none);
    uint8_t keep = w.w[1].scales[3];
    w.w[1].scales[3] = 0x7F;
    assert_int_equal(fm_cuda_weights_create(w.w, 2, &none), FM_ERR_NONFINITE);
    w.w[1].scales[3] = keep;
    CK(cudaFree(doff));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    fm_cuda_weights_destroy(cw);
    gpu_experts_free(&w);
}

/* The multi-block kernels (feature_blocks > 1: one CTA, several consecutive feature
 * blocks, one K pipeline across them): 3 per CTA over 8 blocks (the last CTA has
 * 2), K tails for kc = 128 and 256, SwiGLU pairs, the deterministic FINALIZE, more
 * blocks asked than exist; and the statuses of a tile without that kernel. */
static void test_multi_block(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 7);
    fm_tile tiles[64];
    size_t  n = all_tiles(tiles, 64);
    static const gcase skewed_wide = {4, 512, 448, {1, 0, 19, 7}};
    int     tested = 0;
    for (size_t i = 0; i < n; i++) {
        const fm_tile *t = &tiles[i];
        if (is_wgmma(t) || t->kc > 256 || skip_tile(i, n)) continue;
        g_blocks = 3;
        fm_status s = run_case_limit(&r, FM_FORMAT_NVFP4, &skewed_wide, t, FM_CUDA_EPI_NONE, 0);
        if (s == FM_ERR_UNSUPPORTED) { /* this tile has no multi-block kernel: refused, output untouched */
            g_blocks = 0;
            continue;
        }
        assert_int_equal(s, FM_OK);
        tested++;
        if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &skewed_wide, t, FM_CUDA_EPI_SWIGLU);
        run_case(&r, FM_FORMAT_NVFP4, &skewed_wide, t, FM_CUDA_EPI_FINALIZE_DET);
        run_case(&r, FM_FORMAT_MXFP4, &k_mixed_mx, t, FM_CUDA_EPI_NONE);
        g_blocks = 1000; /* more than the shape has: one CTA per expert */
        run_case(&r, FM_FORMAT_NVFP4, &skewed_wide, t, FM_CUDA_EPI_NONE);
        g_blocks = 0;
    }
    printf("  %d tiles with a multi-block kernel checked\n", tested);
    if (!getenv("FM_QUICK")) assert_true(tested >= 4);
    /* statuses: negative, a tile without the kernel, a wgmma tile */
    fm_tile plain = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA}, wg = {8, 2, 4, 128, 4, 0, FM_FAMILY_FP4MOE_WGMMA};
    g_blocks = -1;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_mixed, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_INVALID_ARG);
    g_blocks = 2;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_mixed, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_UNSUPPORTED);
    if (device_is_sm90())
        assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_big, &wg, FM_CUDA_EPI_NONE, 0), FM_ERR_UNSUPPORTED);
    g_blocks = 0;
}

/* Split K (k_splits): every mma tile's plain kernel with K split 2, 3 and as many
 * ways as it has K stages, every epilogue, several passes (k_big: 513 rows on one
 * expert), zero-row experts, both formats, against the reference and bit-for-bit
 * against its own second run (run_case_limit); then the refusals, output untouched. */
static void test_k_split(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 11);
    fm_tile      tiles[64];
    size_t       n = all_tiles(tiles, 64);
    static const gcase long_k = {3, 128, 2048, {1, 0, 5}};
    int          tested = 0;
    for (size_t i = 0; i < n; i++) {
        const fm_tile *t = &tiles[i];
        if (is_wgmma(t) || skip_tile(i, n)) continue;
        const int stages_big = (448 + t->kc - 1) / t->kc, stages_long = 2048 / t->kc;
        const int splits[3] = {2, 3, stages_long};
        for (int j = 0; j < 3; j++) {
            g_ksplit = splits[j] < stages_long ? splits[j] : stages_long;
            if (g_ksplit < 2) continue;
            run_case(&r, FM_FORMAT_NVFP4, &long_k, t, FM_CUDA_EPI_NONE);
            if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &long_k, t, FM_CUDA_EPI_SWIGLU);
            run_case(&r, FM_FORMAT_MXFP4, &long_k, t, FM_CUDA_EPI_FINALIZE_DET);
            run_case(&r, FM_FORMAT_NVFP4, &long_k, t, FM_CUDA_EPI_FINALIZE);
        }
        g_ksplit = stages_big; /* K = 448: a tail stage; several passes and experts */
        if (g_ksplit >= 2) run_case(&r, FM_FORMAT_NVFP4, &k_big, t, FM_CUDA_EPI_NONE);
        g_ksplit = (208 + t->kc - 1) / t->kc; /* k_mixed: K = 208, zero-row experts */
        if (g_ksplit >= 2) run_case(&r, FM_FORMAT_NVFP4, &k_mixed, t, FM_CUDA_EPI_FINALIZE_DET);
        g_ksplit = 0;
        tested++;
    }
    printf("  %d mma tiles checked with K split\n", tested);
    if (!getenv("FM_QUICK")) assert_true(tested >= 3);
    /* refusals: more splits than K stages, a wgmma tile, the multi-block kernel, no or a
     * short split_ws, out of range */
    fm_tile plain = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA}, wg = {8, 2, 4, 128, 4, 0, FM_FAMILY_FP4MOE_WGMMA},
            mb = {4, 1, 1, 128, 4, 0, FM_FAMILY_FP4MOE_MMA};
    g_ksplit = 2; /* k_mixed: K = 208, one 256-K stage */
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_mixed, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_UNSUPPORTED);
    if (device_is_sm90())
        assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &wg, FM_CUDA_EPI_NONE, 0), FM_ERR_UNSUPPORTED);
    g_blocks = 2;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &mb, FM_CUDA_EPI_NONE, 0), FM_ERR_UNSUPPORTED);
    g_blocks = 0;
    g_ksplit_ws_less = 16;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_INVALID_ARG);
    g_ksplit_ws_less = 0;
    g_ksplit = FM_CUDA_MAX_K_SPLITS + 1;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_INVALID_ARG);
    g_ksplit = -2;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &plain, FM_CUDA_EPI_NONE, 0), FM_ERR_INVALID_ARG);
    g_ksplit = 0;
}

/* The experts' work list (expert_list / expert_slots): grids for 1, 2 and every
 * expert, CTAs looping over more listed experts than slots, zero-row experts listed or
 * not, several passes, with and without split K, every epilogue; a wgmma tile ignores
 * the list (same result). Then expert_slots < 0 is refused, output untouched. */
static void test_expert_list(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 13);
    static const gcase long_k = {6, 128, 1024, {1, 0, 5, 3, 0, 9}};
    const fm_tile tiles[4] = {{4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA}, {4, 2, 1, 128, 4, 0, FM_FAMILY_FP4MOE_MMA},
                              {4, 2, 8, 128, 3, 0, FM_FAMILY_FP4MOE_MMA}, {8, 2, 4, 128, 4, 0, FM_FAMILY_FP4MOE_WGMMA}};
    const int slots[4] = {1, 2, 0, 3};
    g_list = 1;
    for (int ti = 0; ti < 4; ti++) {
        const fm_tile *t = &tiles[ti];
        if (is_wgmma(t) && !device_is_sm90()) continue;
        for (int si = 0; si < 4; si++) {
            g_slots = slots[si];
            g_list_all = si == 3;
            for (int ks = 0; ks <= 2; ks += 2) {
                g_ksplit = is_wgmma(t) ? 0 : ks;
                run_case(&r, FM_FORMAT_NVFP4, &long_k, t, FM_CUDA_EPI_NONE);
                if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &long_k, t, FM_CUDA_EPI_SWIGLU);
                run_case(&r, FM_FORMAT_MXFP4, &long_k, t, FM_CUDA_EPI_FINALIZE_DET);
                if (ks == 0) run_case(&r, FM_FORMAT_NVFP4, &k_big, t, FM_CUDA_EPI_NONE); /* passes */
            }
        }
    }
    g_ksplit = 0, g_list_all = 0;
    g_slots = -1;
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &long_k, &tiles[0], FM_CUDA_EPI_NONE, 0), FM_ERR_INVALID_ARG);
    g_slots = 0, g_list = 0;
}

/* The planner's model is what the launch uses: after a launch, the kernel's
 * dynamic-smem attribute equals fm_smem_mma's total and it has no static smem;
 * with the SM120 limit (101,376 B) exactly the tiles predicted over it are
 * refused (FM_ERR_SMEM_EXCEEDED, output untouched) and the rest run correctly. */
static void test_smem_model(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 4);
    fm_tile tiles[64];
    size_t  n = all_tiles(tiles, 64);
    int     refused = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_tile(i, n)) continue;
        const fm_tile *t = &tiles[i];
        fm_smem_breakdown   bd;
        assert_int_equal(tile_smem(t, &bd), FM_OK);
        fm_status s = run_case_limit(&r, FM_FORMAT_NVFP4, &k_skewed, t, FM_CUDA_EPI_NONE, 101376);
        if (bd.total > 101376) {
            assert_int_equal(s, FM_ERR_SMEM_EXCEEDED);
            refused++;
        } else {
            assert_int_equal(s, FM_OK);
        }
        run_case(&r, FM_FORMAT_NVFP4, &k_skewed, t, FM_CUDA_EPI_NONE); /* device limit: every tile runs */
        size_t st = 1, dyn = 0;
        assert_int_equal(fm_cuda_tile_attributes(t, FM_FORMAT_NVFP4, &st, &dyn), FM_OK);
        char name[64];
        printf("  %-24s predicted %6zu B  static %zu  dynamic attribute %6zu  SM120 %s\n",
               tile_name(t, name, sizeof name), bd.total, st, dyn, bd.total > 101376 ? "refused" : "fits");
        /* the kernels keep no static shared memory (all of it is the row's dynamic bytes);
         * the attribute's dynamic size is the launcher's own fm_smem_* call, so it is
         * printed, not compared: what the compiled kernel holds against its row (template
         * arguments, launch bounds, shared memory) is test_kernel_resources', on the CPU */
        assert_int_equal(st, 0);
    }
    /* no tile given: the default falls back to a tile that fits the lowered limit */
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_skewed, NULL, FM_CUDA_EPI_SWIGLU, 101376), FM_OK);
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &k_skewed, NULL, FM_CUDA_EPI_NONE, 0), FM_OK);
    if (!getenv("FM_QUICK")) {
        assert_true(refused > 0); /* the list holds tiles on both sides of the SM120 limit */
        assert_true(refused < (int)n);
    }
}

/* N that does not fill the last warp's mt bands (N = 224: 14 bands; mt = 4 leaves
 * a warp with 2 bands inside N and 2 past it; an earlier kernel dropped the
 * whole warp), with a K tail stage and zero-row experts. */
static void test_partial_warp_bands(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 5);
    static const gcase wide = {3, 224, 320, {2, 0, 11}};
    fm_tile            tiles[64];
    size_t             n = all_tiles(tiles, 64);
    for (size_t i = 0; i < n; i++) {
        if (skip_tile(i, n)) continue;
        const fm_tile *t = &tiles[i];
        run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_NONE);
        if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_SWIGLU);
        run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_FINALIZE_DET); /* staged FP32 rows where they fit */
        if (t->nt >= 2) { /* output not 16-byte aligned: the direct epilogue */
            g_y_off = 2;
            run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_NONE);
            if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_SWIGLU);
            g_y_off = 0;
        }
        if (is_wgmma(t)) { /* the natural-X kernel: partial bands, both epilogues (persistent: refused) */
            g_x_packed = 0;
            run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_NONE);
            if (t->mt % 2 == 0) run_case(&r, FM_FORMAT_NVFP4, &wide, t, FM_CUDA_EPI_SWIGLU);
            g_x_packed = 1;
        }
    }
}

/* No tile given: the launcher runs the planner's first candidate (fm_plan_fp4moe on
 * the device's row of the GPU table), within a lowered limit too. (Whether each compiled
 * kernel is its catalogue row, multi-block kernels included, is test_kernel_resources':
 * it reads the compiled kernels' own template arguments from ptxas, on the CPU.) */
static void test_planner_choice(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 9);
    fm_device_info dev;
    assert_int_equal(fm_device_query(0, &dev), FM_OK);
    /* the public planner's choice is compared where the device plans for the H200's table
     * row (the cost model's rates are the H200's); an H100 SXM also has cc 9.0 and 132 SMs,
     * but its row (3.35 TB/s) ranks other tiles, so cc and SMs alone do not say H200 */
    const fm_cuda_device *cd = NULL;
    assert_int_equal(fm_cuda_device_current(&cd), FM_OK);
    const fm_gpu_info *h200 = fm_cuda_device_plan_gpu(cd);
    const int          on_h200 = strcmp(h200->name, "h200") == 0;
    if (!on_h200) printf("  planner comparison not run: this device plans for \"%s\", not h200\n", h200->name);
    static const struct { int e, n, k; } shapes[] = {{32, 4096, 6144}, {256, 6144, 256}, {8, 512, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int m = 1; m <= 1024; m *= 4)
            for (int pk = 0; pk < 2; pk++)
                for (size_t lim = 0; lim <= 101376; lim += 101376) {
                    fm_cuda_weights fake; /* only the shape and format are read */
                    memset(&fake, 0, sizeof fake);
                    fake.fmt = FM_FORMAT_NVFP4, fake.n_experts = shapes[si].e, fake.n = shapes[si].n,
                    fake.k = shapes[si].k;
                    fm_cuda_gemm_args a = {.w = &fake, .epi = FM_CUDA_EPI_NONE, .expected_rows = m, .x_packed = pk,
                                           .smem_limit = lim};
                    fm_tile   t;
                    int       nb = 0;
                    fm_status st = fm_cuda_gemm_choose(&a, &t, &nb, NULL, NULL);
                    if (pk && dev.cc != 90) {
                        assert_int_equal(st, FM_ERR_ARCH_MISMATCH);
                        continue;
                    }
                    assert_int_equal(st, FM_OK);
                    fm_smem_breakdown bd;
                    assert_int_equal(tile_smem(&t, &bd), FM_OK);
                    assert_true(bd.total <= (lim ? lim : dev.smem_block_optin));
                    if (pk) assert_true(is_wgmma(&t));
                    else assert_true(!(is_wgmma(&t) && t.persist)); /* packed X only */
                    if (!on_h200) continue;
                    fm_fp4moe_query  q = {.weights = FM_ELEM_NVFP4, .x_packed = pk, .smem_limit = lim};
                    fm_fp4moe_choice c;
                    size_t           cnt = 0;
                    assert_int_equal(fm_plan_fp4moe(h200, &q, m, shapes[si].n, shapes[si].k, shapes[si].e, &c, 1,
                                                    &cnt, NULL),
                                     FM_OK);
                    assert_int_equal(t.warps, c.tile.warps);
                    assert_int_equal(t.mt, c.tile.mt);
                    assert_int_equal(t.nt, c.tile.nt);
                    assert_int_equal(t.kc, c.tile.kc);
                    assert_int_equal(t.stages, c.tile.stages);
                    assert_int_equal(nb, c.feature_blocks);
                    assert_int_equal(is_wgmma(&t), c.tile.family == FM_FAMILY_FP4MOE_WGMMA);
                    assert_int_equal(is_wgmma(&t) && t.persist, c.tile.persist);
                }
    /* nothing fits: the planner's status, nothing launched */
    fm_cuda_weights fake;
    memset(&fake, 0, sizeof fake);
    fake.fmt = FM_FORMAT_NVFP4, fake.n_experts = 4, fake.n = 256, fake.k = 256;
    fm_cuda_gemm_args a = {.w = &fake, .expected_rows = 1, .smem_limit = 1000};
    fm_tile           t;
    assert_int_equal(fm_cuda_gemm_choose(&a, &t, NULL, NULL, NULL), FM_ERR_SMEM_EXCEEDED);
    /* and the chosen tiles compute: SwiGLU and plain, with the SM120 limit and without */
    static const gcase c1 = {5, 512, 384, {3, 0, 17, 1, 40}};
    assert_int_equal(run_case_limit(&r, FM_FORMAT_NVFP4, &c1, NULL, FM_CUDA_EPI_SWIGLU, 101376), FM_OK);
    assert_int_equal(run_case_limit(&r, FM_FORMAT_MXFP4, &c1, NULL, FM_CUDA_EPI_NONE, 0), FM_OK);
}

/* The planner's CTAs per SM (fm_fp4moe_occupancy: shared memory, the ptxas register
 * table, threads, block slots) equal the runtime's occupancy of every compiled kernel,
 * and on compute capability 9.0 the table's registers equal cudaFuncGetAttributes'
 * (the table is sm_90a's: bench/regs_table.py regenerates it). */
static void test_occupancy(void **state)
{
    (void)state;
    fm_device_info dev;
    assert_int_equal(fm_device_query(0, &dev), FM_OK);
    const fm_arch_info *arch = NULL;
    assert_int_equal(fm_arch_get(dev.cc, &arch), FM_OK);
    int    sm90 = dev.cc == 90, checked = 0, bad = 0;
    size_t n = 0;
    for (int f = 0; f < 2; f++) {
        if (f && !sm90) continue;
        const fm_tile *tl = f ? fm_wgmma_tiles(&n) : fm_mma_tiles(&n);
        fm_kernel_family      fam = f ? FM_FAMILY_FP4MOE_WGMMA : FM_FAMILY_FP4MOE_MMA;
        for (size_t i = 0; i < n; i++)
            for (int flag = 0; flag < 2; flag++) {
                if (!f && flag && !fm_mma_tile_has_mb(&tl[i])) continue;
                if (f && tl[i].persist && !flag) continue; /* the persistent kernel: packed X only */
                /* the planner's and the table's variant: flag = multi-block (mma) / packed X (wgmma) */
                fm_kernel_variant v = fm_variant_of(fam, &tl[i], flag ? 2 : 1, flag);
                fm_smem_breakdown bd;
                assert_int_equal(f ? fm_smem_wgmma(&tl[i], &bd) : fm_smem_mma(&tl[i], &bd), FM_OK);
                int blocks = -1, regs = -1;
                CK(f ? fm_wgmma_occupancy((int)i, flag, bd.total, &blocks, &regs)
                     : fm_mma_occupancy((int)i, flag, bd.total, &blocks, &regs));
                int model = fm_fp4moe_occupancy(arch, &tl[i], v, bd.total);
                int table = fm_fp4moe_kernel_regs(&tl[i], v);
                char name[64];
                (f ? fm_wgmma_tile_name : fm_mma_tile_name)(&tl[i], name, sizeof name);
                int ok = blocks == model && (!sm90 || regs == table);
                printf("  %-22s %s  CTAs/SM runtime %d planner %d  registers %d table %d%s\n", name,
                       f ? (v == FM_VARIANT_WGMMA_PERSISTENT ? "persist" : flag ? "packed " : "natural") : (flag ? "mb     " : "plain  "), blocks,
                       model, regs, table,
                       ok ? "" : "  <- differs");
                bad += !ok;
                checked++;
            }
    }
    printf("  %d kernels, %d differ%s\n", checked, bad, sm90 ? "" : " (not sm_90: registers not compared)");
    assert_int_equal(bad, 0);
}

/* every test starts without split K (a failed test_k_split leaves no trace in the next) */
static int reset_split(void **state)
{
    (void)state;
    g_ksplit = 0;
    g_ksplit_ws_less = 0;
    g_list = g_slots = g_list_all = 0;
    return 0;
}

int main(void)
{
    fm_test_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_every_tile_nvfp4, reset_split),
        cmocka_unit_test_setup(test_every_tile_mxfp4, reset_split),
        cmocka_unit_test_setup(test_skew_and_finalize, reset_split),
        cmocka_unit_test_setup(test_wgmma_epilogues, reset_split),
        cmocka_unit_test_setup(test_persistent, reset_split),
        cmocka_unit_test_setup(test_x_pack, reset_split),
        cmocka_unit_test_setup(test_partial_warp_bands, reset_split),
        cmocka_unit_test_setup(test_statuses, reset_split),
        cmocka_unit_test_setup(test_multi_block, reset_split),
        cmocka_unit_test_setup(test_k_split, reset_split),
        cmocka_unit_test_setup(test_expert_list, reset_split),
        cmocka_unit_test_setup(test_smem_model, reset_split),
        cmocka_unit_test_setup(test_planner_choice, reset_split),
        cmocka_unit_test_setup(test_occupancy, reset_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
