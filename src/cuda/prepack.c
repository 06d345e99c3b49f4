/* prepack.c - turn checkpoint-layout FP4 weights into the layout the mma
 * kernel streams (host side, once per layer; plain C so it is testable anywhere).
 *
 * Layout of one expert [N][K] (kp = K rounded up to 64, zero-padded):
 *   data  [N/16 bands][kp/64 chunks][32 lanes][16 B]
 *   scale [N/16 bands][kp/64 chunks][32 lanes][2 B]
 * Lane l = 4*g + t of the warp (g = l/4, t = l%4, the mma.sync fragment coords)
 * holds, for mma step s (word s of its 16 bytes) and register j = 0..3 of the
 * m16n8k16 A fragment, the pair (h = 0, 1) of codes
 *   row = band*16 + g + 8*(j & 1),  k = chunk*64 + 16*t + 4*s + 2*(j >> 1) + h.
 * K is permuted inside a chunk (the kernel reads X with the same permutation),
 * so that lane t's 16 K values of a chunk form exactly one NVFP4 block (half an
 * MXFP4 block): 2 scale bytes per lane per chunk (rows g and g+8).
 *
 * Bits of a code pair inside its 32-bit word are placed so that the kernel gets a
 * BF16x2 of (value * 2^-126) with few ops: sign -> bit 15/31, e1 e0 m ->
 * bits 8..6 / 24..22 after                                   (M = 0x81C081C0)
 *   j=0: (w & 0x80C080C0) | ((w << 8) & 0x01000100)          3 ops
 *   j=1: (w << 4) & M                                        2 ops
 *   j=2: rotl(w, 14) & M,  j=3: rotl(w, 10) & M              2 ops each
 * 9 integer ops per word (7 on the ALU pipe, the two left shifts as IMAD.SHL on
 * the FMA pipe), found by an exhaustive search over shifts, rotations and two-shift
 * merges (the GEMM notebook: git show bd14b3f6d154:bench/NOTES-gpu.md); the four sets of
 * source bits partition the word
 * (k_pos below); the obvious placement (j=1 (w<<3)&M, j=2/3 two shifts each) takes 11.
 *
 * Scale byte codes (0 = the block is all zero: its codes are zeroed too):
 *   NVFP4: E4M3 -> unsigned E5M3, byte = ((e' + 10) << 3) | m' with value 2^e' (1 + m'/8)
 *          (subnormal E4M3 normalised); kernel: bf16 = byte*16 + 0x7600 = scale * 2^119,
 *          so the BF16 weight is e2m1 * scale * 2^-7 (exact), oscale = global * 2^7.
 *   MXFP4: byte = c - cmin + 1 (c = UE8M0 code, cmin over the expert's non-zero
 *          blocks; span <= 126), kernel: bf16 exponent = byte + 127, oscale = 2^(cmin-2).
 */
#include <math.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "fm_internal.h"
#include "format/format_internal.h"

/*   format        planner elem     scale byte                 decode mul   decode add */
static const fm_pack_format k_pack_formats[] = {
    {FM_FORMAT_NVFP4, FM_ELEM_NVFP4, FM_PACK_SCALE_E5M3, 0x00100010u /* E5M3 code << 4 */,
     0x76007600u /* + (127 + 119 - 10) << 7 */},
    {FM_FORMAT_MXFP4, FM_ELEM_MXFP4, FM_PACK_SCALE_EXP_REBASED, 0x00800080u /* biased exponent code << 7 */,
     0x3F803F80u /* + 127 << 7 */},
};

const fm_pack_format *fm_pack_format_get(fm_format f)
{
    for (size_t i = 0; i < sizeof k_pack_formats / sizeof k_pack_formats[0]; i++)
        if (k_pack_formats[i].format == f) return &k_pack_formats[i];
    return NULL;
}

/* Source bit of code bit b (0 = m, 1 = e0, 2 = e1, 3 = sign) of pair j, half h. */
static const uint8_t k_pos[4][2][4] = {
    /* j=0 */ {{6, 7, 0, 15}, {22, 23, 16, 31}},
    /* j=1 */ {{2, 3, 4, 11}, {18, 19, 20, 27}},
    /* j=2 */ {{24, 25, 26, 1}, {8, 9, 10, 17}},
    /* j=3 */ {{28, 29, 30, 5}, {12, 13, 14, 21}},
};

void fm_cuda_prepack_sizes(int64_t n, int64_t k, size_t *data_bytes, size_t *scale_bytes)
{
    int64_t chunks = (n / FM_PACK_BAND) * ((k + FM_PACK_KCHUNK - 1) / FM_PACK_KCHUNK);
    if (data_bytes) *data_bytes = (size_t)chunks * FM_PACK_CHUNK_BYTES;
    if (scale_bytes) *scale_bytes = (size_t)chunks * FM_PACK_SCALE_BYTES;
}

/* Whether block b of row `row` (blk codes) has a non-zero magnitude: its bytes masked to
 * the magnitude bits of both codes (blk is even, blocks start on a byte). */
static int block_nonzero(const fm_qtensor *w, int64_t row, int64_t b, int blk)
{
    const uint8_t *d = (const uint8_t *)w->data + row * (w->cols / 2) + b * blk / 2;
    for (int i = 0; i < blk / 2; i++)
        if (d[i] & 0x77) return 1;
    return 0;
}

/* NVFP4 E4M3 scale -> byte code (0 for a zero scale). */
static uint8_t nv_code(uint8_t s)
{
    int e = (s >> 3) & 15, m = s & 7;
    if (e == 0 && m == 0) return 0;
    int ep, mp;
    if (e > 0) {
        ep = e - 7;
        mp = m;
    } else {
        int p = m >= 4 ? 2 : (m >= 2 ? 1 : 0); /* msb of the subnormal mantissa */
        ep = p - 9;
        mp = (m << (3 - p)) & 7;
    }
    return (uint8_t)(((ep + 10) << 3) | mp);
}

fm_status fm_cuda_prepack(const fm_qtensor *w, uint8_t *data, uint8_t *scale, float *oscale)
{
    if (!w || !data || !scale || !oscale || !w->data || !w->scales)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_prepack: NULL argument");
    const fm_pack_format   *pf = fm_pack_format_get(w->fmt);
    const fm_format_traits *tr = fm_format_traits_get(w->fmt);
    if (!pf || !tr)
        return fm_fail(FM_ERR_FORMAT, "fm_cuda_prepack: format %d is not NVFP4 or MXFP4", (int)w->fmt);
    const int     rebased = pf->code == FM_PACK_SCALE_EXP_REBASED; /* MXFP4: exponents rebased per expert */
    const int64_t N = w->rows, K = w->cols;
    const int     blk = tr->block;
    if (N <= 0 || N % FM_PACK_BAND || K <= 0 || K % blk)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_prepack: [%lld x %lld] needs N %% 16 == 0 and K %% %d == 0",
                       (long long)N, (long long)K, blk);
    if (!isfinite(w->global_scale) || w->global_scale <= 0)
        return fm_fail(FM_ERR_NONFINITE, "fm_cuda_prepack: global scale %g", (double)w->global_scale);
    const int64_t nsb = K / blk; /* scales per row */
    FM_CHECK(fm_scales_check_codes("fm_cuda_prepack", tr->scale_type, w->scales, N, nsb));
    /* pass 1: validate scales, find the MXFP4 exponent range over non-zero blocks */
    int cmin = 255, cmax = -1;
    for (int64_t r = 0; r < N; r++)
        for (int64_t b = 0; b < nsb; b++) {
            uint8_t s = w->scales[r * nsb + b];
            if (!rebased) {
                if ((s & 0x80) && (s & 0x7F))
                    return fm_fail(FM_ERR_FORMAT, "fm_cuda_prepack: negative block scale at row %lld block %lld",
                                   (long long)r, (long long)b);
            } else {
                if (block_nonzero(w, r, b, blk)) {
                    if (s < cmin) cmin = s;
                    if (s > cmax) cmax = s;
                }
            }
        }
    float os;
    if (!rebased) {
        os = w->global_scale * 128.0f; /* undo the 2^-7 folded into the BF16 weights */
    } else {
        if (cmax < 0) cmin = cmax = 127; /* all-zero expert */
        if (cmax - cmin > 126)
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "fm_cuda_prepack: MXFP4 scale exponents span %d..%d (more than 126 binades) in one expert",
                           cmin - 127, cmax - 127);
        os = ldexpf(w->global_scale, cmin - 2);
        if (!isfinite(os) || os == 0)
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_prepack: MXFP4 scale 2^%d is outside FP32", cmin - 2);
    }
    const int64_t KB = (K + FM_PACK_KCHUNK - 1) / FM_PACK_KCHUNK;
    /* the word bits of one source byte (two codes: low nibble = even k = half 0) at pair j:
     * a lookup per byte instead of a loop over each code's 4 bits (the placement is k_pos's) */
    uint32_t tab[4][256];
    for (int j = 0; j < 4; j++)
        for (int byte = 0; byte < 256; byte++) {
            uint32_t v = 0;
            for (int h = 0; h < 2; h++)
                for (int bit = 0; bit < 4; bit++)
                    if ((byte >> (4 * h)) >> bit & 1) v |= 1u << k_pos[j][h][bit];
            tab[j][byte] = v;
        }
    /* bands are independent (each writes its own chunks): one per thread when the matrix
     * is large enough to pay for the team (layer create prepacks every expert: seconds on
     * one core for a GLM-5 shard) */
    const int64_t nbands = N / FM_PACK_BAND;
#pragma omp parallel for schedule(static) if (N * K >= (1 << 22))
    for (int64_t band = 0; band < nbands; band++)
        for (int64_t c = 0; c < KB; c++) {
            uint8_t *dch = data + (band * KB + c) * FM_PACK_CHUNK_BYTES;
            uint8_t *sch = scale + (band * KB + c) * FM_PACK_SCALE_BYTES;
            for (int lane = 0; lane < 32; lane++) {
                int     g = lane >> 2, t = lane & 3;
                int64_t k0 = c * FM_PACK_KCHUNK + 16 * t; /* this lane's 16 K values */
                uint8_t bytes[2] = {0, 0};                /* scale code of rows g, g + 8 */
                for (int half = 0; half < 2; half++) {
                    int64_t row = band * 16 + g + 8 * half, b = k0 / blk;
                    if (k0 >= K) continue;
                    uint8_t sc = w->scales[row * nsb + b];
                    if (!rebased) bytes[half] = nv_code(sc);
                    else bytes[half] = block_nonzero(w, row, b, blk) ? (uint8_t)(sc - cmin + 1) : 0;
                }
                sch[lane * 2] = bytes[0];
                sch[lane * 2 + 1] = bytes[1];
                /* K is a multiple of the block (>= 16): a lane's 16 K values are all in K or
                 * all padding; pair j takes row g + 8 (j & 1), codes k0 + 4 st + 2 (j >> 1) + h,
                 * i.e. byte 2 st + (j >> 1) of the row's 8 bytes at k0; a zero block (scale code
                 * 0) or padding gives code 0 */
                const uint8_t *r0 = NULL, *r1 = NULL;
                if (k0 < K) {
                    r0 = (const uint8_t *)w->data + (band * 16 + g) * (K / 2) + k0 / 2;
                    r1 = r0 + 8 * (K / 2);
                }
                for (int st = 0; st < 4; st++) {
                    uint32_t word = 0;
                    if (r0 && bytes[0]) word |= tab[0][r0[2 * st]] | tab[2][r0[2 * st + 1]];
                    if (r1 && bytes[1]) word |= tab[1][r1[2 * st]] | tab[3][r1[2 * st + 1]];
                    memcpy(dch + lane * 16 + st * 4, &word, 4);
                }
            }
        }
    *oscale = os;
    return FM_OK;
}

/* The kernel's extraction of register j (BF16x2 bits of value * 2^-126). */
static uint32_t rotl32(uint32_t w, int s) { return (w << s) | (w >> (32 - s)); }

static uint32_t extract(uint32_t w, int j)
{
    const uint32_t M = 0x81C081C0u;
    switch (j) {
    case 0: return (w & 0x80C080C0u) | ((w << 8) & 0x01000100u);
    case 1: return (w << 4) & M;
    case 2: return rotl32(w, 14) & M;
    default: return rotl32(w, 10) & M;
    }
}

static float bf16_bits_to_f32(uint32_t b16)
{
    uint32_t u = b16 << 16;
    float    f;
    memcpy(&f, &u, 4);
    return f;
}

void fm_cuda_unpack(const uint8_t *data, const uint8_t *scale, float oscale, fm_format fmt, int64_t n, int64_t k,
                    float *dst)
{
    const int64_t  KB = (k + FM_PACK_KCHUNK - 1) / FM_PACK_KCHUNK;
    const fm_pack_format *pf = fm_pack_format_get(fmt);
    if (!pf) return; /* not a prepacked format: nothing to decode */
    const uint32_t mul = pf->sc_mul, add = pf->sc_add;
    for (int64_t band = 0; band < n / FM_PACK_BAND; band++)
        for (int64_t c = 0; c < KB; c++)
            for (int lane = 0; lane < 32; lane++) {
                const uint8_t *dch = data + (band * KB + c) * FM_PACK_CHUNK_BYTES + lane * 16;
                const uint8_t *sch = scale + (band * KB + c) * FM_PACK_SCALE_BYTES + lane * 2;
                int            g = lane >> 2, t = lane & 3;
                for (int s = 0; s < 4; s++) {
                    uint32_t w;
                    memcpy(&w, dch + 4 * s, 4);
                    for (int j = 0; j < 4; j++) {
                        uint32_t r = extract(w, j), sc = sch[j & 1] * mul + add;
                        for (int h = 0; h < 2; h++) {
                            int64_t row = band * 16 + g + 8 * (j & 1);
                            int64_t kk = c * FM_PACK_KCHUNK + 16 * t + 4 * s + 2 * (j >> 1) + h;
                            if (kk >= k) continue;
                            /* BF16 product is exact (<= 6 significant bits, normal range) */
                            float v = bf16_bits_to_f32((r >> (16 * h)) & 0xFFFF) *
                                      bf16_bits_to_f32((sc >> (16 * h)) & 0xFFFF);
                            dst[row * k + kk] = v * oscale;
                        }
                    }
                }
            }
}
