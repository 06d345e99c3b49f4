/* kernels_prefill512.c - the AVX-512 prefill kernel: many activation rows per
 * expert (M > 3), where the FMA units, not DRAM, set the pace.
 *
 * Blocking (BLIS-style, sizes for a 48 KB L1d / 2 MB L2 core):
 *   for each panel of up to FM_CPU_PANEL_ROWS (16) weight rows:
 *     dequantize it once into FP32 (16 x K floats: 384 KB at K = 6144, L2),
 *     streaming the FP4 bytes from memory once; layout [quad][K/16][4][16],
 *     so a quad's 4 rows are one contiguous stream;
 *     for each block of up to FM_CPU_PANEL_MC activation rows:
 *       for each K block of KC (FM_CPU_PANEL_KC) floats: panel slice 16 x KC
 *         for each tile of up to 6 activation rows: packed to [KC/16][h][16]
 *           for each quad of 4 panel rows:
 *             micro-kernel: 4 x 6 accumulators of 16 lanes (24 zmm), per 16
 *             elements 4 + 6 loads feed 24 FMAs.
 * Packing matters: routed rows sit K floats apart, a multiple of 4 KB at model
 * sizes, so read in place a tile's rows and the panel rows would all map to
 * the same L1 sets.
 * The accumulators are kept per (activation row, weight row) as 16-lane
 * vectors and spilled to the work buffer between K blocks, instead of being
 * reduced: lane l still sums elements k % 16 == l in K order with FMA, and the
 * last K block folds them with fm_hsum16. So every output is bit for bit what
 * the decode kernels and the AVX2 path compute (kernels.c's lane structure),
 * whatever M, the tile an activation row falls in, or the thread.
 * Tile heights are balanced (M = 16 runs as 6 + 5 + 5, not 6 + 6 + 4) so no
 * tile runs far below the 24-FMA shape. A last quad with fewer than 4 rows
 * (n1 - n0 not a multiple of 4) is padded with zero rows that are not stored.
 * Measured (this 2-vCPU AVX-512 VM, one thread, K = 6144): ~95 GFLOP/s at 48
 * rows, ~78 at 16, ~60 at 8, against ~174 for a pure register FMA loop; the
 * two vCPUs share one core's FMA units (2 threads: ~89 each).
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include "kernels_x86.h"

#include <stdint.h>

#define KC FM_CPU_PANEL_KC
#define MR 6 /* activation rows per register tile (24 accumulators + 4 weights + 1) */
#define NR 4 /* weight rows per register tile: a "quad" */

/* One weight row dequantized (block scales applied), its 16-element chunk j
 * stored at out + j * 64 (the quad-interleaved panel layout); the same values
 * as the AVX2 decoder (exact products 2*E2M1 x 0.5*scale). */
FM_AVX512 static void decode_row512(const fm_qtensor *w, const fm_cpu_luts *L, __m512 table, int blk, int64_t n,
                                    float *out)
{
    const int64_t K = w->cols;
    if (w->fmt == FM_FORMAT_BF16) {
        const uint16_t *d = (const uint16_t *)w->data + n * K;
        for (int64_t k = 0; k < K; k += 16, out += 16 * NR) {
            __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(d + k)));
            _mm512_store_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))); /* BF16: FP32's top half */
        }
        return;
    }
    const int64_t nb = K / blk;
    const int cpb = blk / 16;
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    for (int64_t b = 0; b < nb; b++) {
        const __m512 ts = _mm512_mul_ps(table, _mm512_set1_ps(L->scale[sc[b]]));
        if ((b & (8 / cpb - 1)) == 0) _mm_prefetch((const char *)(q + FM_PREFETCH), _MM_HINT_T0);
        for (int c = 0; c < cpb; c++, q += 8, out += 16 * NR) _mm512_store_ps(out, fm_dec16_512(q, ts));
    }
}

/* The micro-kernel: H (1..6, a constant after inlining) activation rows x the
 * 4 rows of a panel quad over kc elements. P: the quad's chunks from k0,
 * [kc/16][4][16]; a: the packed tile, [kc/16][H][16]. acc holds the 16-lane
 * partial sums [H][4][16] between K blocks (read unless first, written unless
 * last); on the last block they are folded and nr (1..4) outputs per row
 * stored. */
FM_AVX512_INLINE static void tile(const float *P, const float *a, int64_t kc, const int H, float *acc, int first,
                                  int last, int nr, float g, float *Y, int64_t ldy)
{
    __m512 c[MR][NR];
    for (int i = 0; i < H; i++)
        for (int r = 0; r < NR; r++)
            c[i][r] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc + (i * NR + r) * 16);
    for (int64_t k = 0; k < kc; k += 16, P += 16 * NR, a += 16 * H) {
        const __m512 w0 = _mm512_load_ps(P), w1 = _mm512_load_ps(P + 16);
        const __m512 w2 = _mm512_load_ps(P + 32), w3 = _mm512_load_ps(P + 48);
        for (int i = 0; i < H; i++) {
            const __m512 x = _mm512_load_ps(a + 16 * i);
            c[i][0] = _mm512_fmadd_ps(w0, x, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(w1, x, c[i][1]);
            c[i][2] = _mm512_fmadd_ps(w2, x, c[i][2]);
            c[i][3] = _mm512_fmadd_ps(w3, x, c[i][3]);
        }
    }
    if (last) {
        for (int i = 0; i < H; i++)
            for (int r = 0; r < nr; r++) Y[i * ldy + r] = fm_hsum16(c[i][r]) * g;
    } else {
        for (int i = 0; i < H; i++)
            for (int r = 0; r < NR; r++) _mm512_store_ps(acc + (i * NR + r) * 16, c[i][r]);
    }
}

/* Rows [0, h) of A, elements [k0, k0 + kc), into pack as [kc/16][h][16]: one
 * contiguous stream for the micro-kernel. (Routed rows sit K floats apart, a
 * multiple of 4 KB at model sizes: read in place, a tile's rows and the panel
 * would all fall into the same L1 sets.) */
FM_AVX512 static void pack_a(const float *A, int64_t lda, int h, int64_t k0, int64_t kc, float *pack)
{
    for (int i = 0; i < h; i++)
        for (int64_t k = 0; k < kc; k += 16)
            _mm512_store_ps(pack + (k * h + 16 * i), _mm512_loadu_ps(A + i * lda + k0 + k));
}

/* Activation rows [0, mh) against the decoded panel (np rows in quads). */
FM_AVX512 static void panel_rows(const float *panel, int np, int64_t K, const float *A, int64_t lda, int mh,
                                 float *accs, float *pack, float g, float *Y, int64_t ldy)
{
    const int ntiles = (mh + MR - 1) / MR, base = mh / ntiles, extra = mh % ntiles;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        const int first = k0 == 0, last = k0 + kc == K;
        int m = 0;
        for (int t = 0; t < ntiles; t++) {
            const int h = base + (t < extra);
            pack_a(A + m * lda, lda, h, k0, kc, pack);
            for (int q = 0; q < np; q += NR) {
                const int nr = np - q < NR ? np - q : NR;
                const float *P = panel + (int64_t)q * K + k0 * NR;
                float *acc = accs + ((int64_t)m * FM_CPU_PANEL_ROWS + q * h) * 16; /* [tile][quad][h][4][16] */
                float *y = Y + m * ldy + q;
                switch (h) {
                case 1: tile(P, pack, kc, 1, acc, first, last, nr, g, y, ldy); break;
                case 2: tile(P, pack, kc, 2, acc, first, last, nr, g, y, ldy); break;
                case 3: tile(P, pack, kc, 3, acc, first, last, nr, g, y, ldy); break;
                case 4: tile(P, pack, kc, 4, acc, first, last, nr, g, y, ldy); break;
                case 5: tile(P, pack, kc, 5, acc, first, last, nr, g, y, ldy); break;
                default: tile(P, pack, kc, 6, acc, first, last, nr, g, y, ldy); break;
                }
            }
            m += h;
        }
    }
}

FM_AVX512 void fm_cpu_prefill512(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                                 int64_t lda, int M, float *Y, int64_t ldy, float *work)
{
    const int64_t K = w->cols;
    const int blk = fm_cpu_fmt_block(w->fmt);
    const __m512 table = fm_e2m1_table512(L);
    /* work: [panel 16 x K][accumulators MC x 16 x 16][A pack 6 x KC], 64-byte
     * aligned (the 16 spare floats; K % 16 == 0 keeps the rest aligned). */
    float *panel = (float *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    float *accs = panel + (int64_t)FM_CPU_PANEL_ROWS * K;
    float *pack = accs + FM_CPU_PANEL_MC * FM_CPU_PANEL_ROWS * 16;
    for (int64_t nb = n0; nb < n1; nb += FM_CPU_PANEL_ROWS) {
        const int np = n1 - nb < FM_CPU_PANEL_ROWS ? (int)(n1 - nb) : FM_CPU_PANEL_ROWS;
        for (int r = 0; r < np; r++) decode_row512(w, L, table, blk, nb + r, panel + (r & ~3) * K + (r & 3) * 16);
        for (int r = np; r % NR; r++) /* a short last quad: zeros, never stored */
            for (int64_t k = 0; k < K; k += 16) _mm512_store_ps(panel + (r & ~3) * K + k * NR + (r & 3) * 16,
                                                                _mm512_setzero_ps());
        for (int m0 = 0; m0 < M; m0 += FM_CPU_PANEL_MC) {
            const int mh = M - m0 < FM_CPU_PANEL_MC ? M - m0 : FM_CPU_PANEL_MC;
            panel_rows(panel, np, K, A + m0 * lda, lda, mh, accs, pack, w->global_scale, Y + m0 * ldy + nb, ldy);
        }
    }
}
#else
typedef int fm_cpu_kernels_prefill512_unused; /* ISO C: no empty translation unit */
#endif
