/* wgmma_ws_fp8.cuh - the W4A8 GEMM's warp-specialized wgmma kernels (fm_fp8mma_args.kernel
 * FM_FP8MMA_WS64 / WS128; sm_90a, MXFP4, opt-in: never the automatic pick). Included inside
 * gemm_fp8.cu's anonymous namespace after the wg kernels, whose pieces it reuses (wg8_desc,
 * wg8_fence, decode_frag, expert_rows, epilogue; the stage of the rows' tile is theirs).
 *
 * The wg kernels decode the FP4 codes into the wgmma's A registers in the MMA loop, one
 * warpgroup doing both: the decode bounds the loop (bench/probe/sass_mix.py). Here a CTA is
 * one producer warpgroup (warps 0-3) and CW consumer warpgroups (warps 4..):
 * - the producer copies each 128-K group's stage global -> shared by cp.async, LA stages ahead
 *   of its decode (the rows' E4M3 tile, 128-byte swizzled as the wg kernels'; the CTA's
 *   packed codes, 4 x CW bands x 2 chunks of 512 B; the bands' group scales; the tokens'
 *   activation scales of the group), then decodes the codes of a landed stage to E4M3 into
 *   the stage's A tile [64 CW rows][128 K] (K-major, 128-byte swizzle: the rows' tile's
 *   layout, one 1 KB atom per 8 rows), writes the group's fold flag and arrives on the
 *   stage's `full` mbarrier;
 * - consumer warpgroup w runs the CTA's m64 tile w of features: SS wgmma m64 x TOK x k32
 *   (E4M3, FP32) with both operands in shared memory, and gives the stage back on its
 *   `empty` mbarrier after the MMAs have completed.
 * Numerics: the wg kernels' exactly, per group and row. The fold vote covers every row of the
 * CTA's tiles (64 x CW rows = the wg kernels' 64 x MT: ws64 and wg64 vote over the same 128
 * rows): where all fold (gemm_fp8.h, FM_FP8MMA_FOLD_MIN), the producer folds each block's
 * exponent into the codes (fm_fp8mma_fold_table: exact) and the consumer runs one wgmma chain
 * over the group's 4 blocks from zero, then acc += (tmp x 2^(max - 133)) x xs; else the
 * producer writes the codes without exponent and the consumer runs each block from zero,
 * acc += tmp x (2^(code - 127) x xs). The same operations in the same order as the wg
 * kernel of the same tile, so its results (wg64 = ws64) should be the same bits.
 * Ring: STAGES slots; stage load q (over all the CTA's passes and groups) takes slot q %
 * STAGES. full[s]: 128 producer arrivals (each after its own copies landed and its decode
 * writes, with a proxy fence); empty[s]: 128 x CW consumer arrivals (each after its
 * warpgroup's wgmma.wait_group 0 and its own shared reads). The producer waits on empty
 * before it copies into a slot (use u waits for the consumers' release of use u - 1; the
 * first use passes: parity 1 of a fresh barrier); the consumers wait on full with parity u.
 * No CTA-wide barrier after the set-up; the producer leaves after its last stage. */

template <int TOK, int CW, int STAGES> struct ws_cfg { /* fm_tile_layout.h's FM_FP8WS_* layout */
    static constexpr int ROWS = 64 * CW, BANDS = 4 * CW, THREADS = 128 * (1 + CW);
    static constexpr int A_OFF = FM_FP8WS_A_OFF(TOK), R_OFF = FM_FP8WS_R_OFF(CW, TOK), S_OFF = FM_FP8WS_S_OFF(CW, TOK);
    static constexpr int XS_OFF = FM_FP8WS_XS_OFF(CW, TOK), F_OFF = FM_FP8WS_F_OFF(CW, TOK);
    static constexpr int STAGE_B = FM_FP8WS_STAGE_BYTES(CW, TOK), SMEM = FM_FP8WS_SMEM(CW, TOK, STAGES);
    static constexpr int BAR_OFF = STAGES * STAGE_B; /* full[STAGES], then empty[STAGES] */
    static constexpr int LA = STAGES / 2;            /* stages copied ahead of the producer's decode */
    static_assert(FM_FP8S_KC == 128 && FM_TILE_CHUNK_K == 64 && FM_TILE_CHUNK_BYTES == 512 && FM_FP8S_SF_BYTES(0) == 64,
                  "one stage = one 128-K group = one 128-byte swizzle line a row; 2 chunks of 512 B a band");
    static_assert(STAGE_B % 1024 == 0 && A_OFF % 1024 == 0 && R_OFF % 16 == 0 && S_OFF % 16 == 0 && XS_OFF % 16 == 0 &&
                      F_OFF % 4 == 0 && F_OFF + 4 <= STAGE_B,
                  "1 KB swizzle atoms; 16-byte copies");
    static_assert(SMEM == BAR_OFF + 16 * STAGES && BAR_OFF % 8 == 0, "the mbarriers after the stages");
    static_assert(LA >= 1 && LA < STAGES, "the decode trails the copies within the ring");
    static_assert(TOK == 64 || TOK == 128, "a wgmma_fp8_ss_t shape");
    static_assert(CW >= 1 && CW <= 2 && ROWS <= 128 && TOK <= 128, "a producer thread per row's scales and token's scale");
    static_assert(SMEM <= 232448, "sm_90's opt-in shared memory (227 KB)");
};

#ifdef FM_FP8WG_BODY
#include "cuda/mbarrier.cuh" /* mbar_init, mbar_arrive, mbar_wait */
/* barrier 1 among the producer warpgroup's 128 threads, returning the AND of v over them
 * (and ordering every producer thread's earlier shared writes, and its landed copies,
 * before the others' later reads) */
__device__ __forceinline__ int ws8_producer_and(int v)
{
    int r;
    asm volatile("{\n.reg .pred pi, po;\nsetp.ne.b32 pi, %1, 0;\nbar.red.and.pred po, 1, 128, pi;\nselp.b32 %0, 1, 0, po;\n}"
                 : "=r"(r)
                 : "r"(v)
                 : "memory");
    return r;
}
#endif

template <int TOK, int CW, int STAGES>
__global__ void __launch_bounds__(128 * (1 + CW), 1) fp8mma_ws_kernel(const fm_fp8mma_args a)
{
#ifdef FM_FP8WG_BODY
    using C = ws_cfg<TOK, CW, STAGES>;
    constexpr int ND = TOK / 2, XIT = TOK * 8 / 128, WIT = 2 * CW; /* accumulators; row segments, code copies a thread */
    extern __shared__ __align__(1024) unsigned char ws_smem[];
    const int e = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int       row0, row1;
    if (!expert_rows(a, e, row0, row1)) return; /* the whole CTA, before any barrier */
    const int      m = row1 - row0, nbands = a.N / 16, nch = a.K / 64, ngrp = (a.K + 127) / 128;
    const int      nq = (m + TOK - 1) / TOK * ngrp; /* the CTA's stage loads: passes x groups */
    const int      band0 = blockIdx.x * C::BANDS;   /* the CTA's bands: band0 + slot, slot 0..BANDS-1 */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(ws_smem);
    const uint32_t bar_full = sbase + C::BAR_OFF, bar_empty = bar_full + 8 * STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bar_full + 8 * s, 128);       /* every producer thread, after its copies and decode */
            mbar_init(bar_empty + 8 * s, 128 * CW); /* every consumer thread, after its MMAs and reads */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        /* ================= producer warpgroup ================= */
        const int pt = threadIdx.x; /* 0..127 */
        /* code copy j (and decode item j): slot sc = warp + 4j = (band slot sc / 2, chunk sc % 2 of
         * the group), this lane's 16 B */
        const uint8_t *wsrc[WIT];
        bool           wv[WIT];
#pragma unroll
        for (int j = 0; j < WIT; j++) {
            const int sc = warp + 4 * j, b = band0 + (sc >> 1);
            wv[j] = b < nbands;
            wsrc[j] = a.wq + (((size_t)e * nbands + (wv[j] ? b : 0)) * (size_t)nch + (sc & 1)) * 512 + lane * 16;
        }
        /* group scales: thread pt < ROWS copies row pt's 4 codes (band slot pt / 16, row pt % 16) */
        const bool     sv = pt < C::ROWS && band0 + pt / 16 < nbands;
        const uint8_t *ssrc = a.wsp + (((size_t)e * nbands + (sv ? band0 + pt / 16 : 0)) * (size_t)ngrp) * 64 + (pt & 15) * 4;
        /* copy the stage of load q (pass from row pass0, group ks) into its slot, once the
         * consumers have given the slot's last use back */
        auto issue = [&](int q, int pass0, int ks) {
            const int s = q % STAGES;
            mbar_wait(bar_empty + 8 * s, ((q / STAGES) + 1) & 1);
            unsigned char *buf = ws_smem + s * C::STAGE_B;
            const int      rows = min(TOK, m - pass0);
#pragma unroll
            for (int j = 0; j < XIT; j++) { /* segment c of row r -> 16 x (c ^ (r % 8)) of the row's line */
                const int  sgi = pt + j * 128, r = sgi >> 3, c = sgi & 7;
                const bool ok = r < rows && ks * 128 + c * 16 < a.K;
                cp_async16(buf + r * 128 + ((c ^ (r & 7)) * 16),
                           ok ? a.xq + (size_t)(row0 + pass0 + r) * a.ldx + ks * 128 + c * 16 : a.xq, ok ? 16 : 0);
            }
#pragma unroll
            for (int j = 0; j < WIT; j++) {
                const bool ok = wv[j] && ks * 2 + ((warp + 4 * j) & 1) < nch;
                cp_async16(buf + C::R_OFF + (warp + 4 * j) * 512 + lane * 16, ok ? wsrc[j] + (size_t)ks * 1024 : a.wq,
                           ok ? 16 : 0);
            }
            if (pt < C::ROWS) cp_async4(buf + C::S_OFF + pt * 4, sv ? ssrc + (size_t)ks * 64 : a.wsp, sv ? 4 : 0);
            if (pt < TOK) { /* the group's activation scale of token pt (0 past the pass's rows; unused per row) */
                const bool ok = a.xs_per_128 && pt < rows;
                cp_async4(buf + C::XS_OFF + pt * 4, ok ? a.xs + (size_t)(row0 + pass0 + pt) * a.ldxs + ks : a.xs, ok ? 4 : 0);
            }
        };
        /* decode the landed stage of load d into its A tile, write the group's fold flag, and
         * hand the stage to the consumers */
        auto decode = [&](int d) {
            const int      s = d % STAGES;
            unsigned char *buf = ws_smem + s * C::STAGE_B;
            /* the vote: every row of the CTA's tiles folds (rows past N: zero codes, fold); the
             * barrier also makes every producer thread's landed copies visible to the others */
            const int fold =
                ws8_producer_and(pt < C::ROWS ? fm_fp8mma_folds(*(const uint32_t *)(buf + C::S_OFF + pt * 4)) : 1);
#pragma unroll
            for (int j = 0; j < WIT; j++) {
                const int      sc = warp + 4 * j, kc = sc & 1, r0 = (sc >> 1) * 16 + g; /* CTA rows r0, r0 + 8 */
                const uint4    w = *(const uint4 *)(buf + C::R_OFF + sc * 512 + lane * 16);
                const uint32_t c0 = *(const uint32_t *)(buf + C::S_OFF + r0 * 4);
                const uint32_t c1 = *(const uint32_t *)(buf + C::S_OFF + (r0 + 8) * 4);
                const int      m0 = (int)fm_fp8mma_maxb(c0), m1 = (int)fm_fp8mma_maxb(c1);
                /* row r's line at A_OFF + 128 r (1 KB atoms of 8 rows); 16-byte column c at
                 * 16 x (c ^ (r % 8)); r0 % 8 = (r0 + 8) % 8 = g */
                unsigned char *l0 = buf + C::A_OFF + r0 * 128 + 4 * t, *l1 = l0 + 8 * 128;
#pragma unroll
                for (int h = 0; h < 2; h++) { /* block kb = 2 x chunk + h of the group */
                    const int      kb = 2 * kc + h;
                    const uint32_t wa = h ? w.z : w.x, wc = h ? w.w : w.y;
                    uint32_t       lo0 = FM_FP8MMA_TLO, hi0 = FM_FP8MMA_THI, lo1 = FM_FP8MMA_TLO, hi1 = FM_FP8MMA_THI;
                    if (fold) {
                        fm_fp8mma_fold_table((int)(c0 >> (8 * kb) & 0xffu) - m0 + 6, &lo0, &hi0);
                        fm_fp8mma_fold_table((int)(c1 >> (8 * kb) & 0xffu) - m1 + 6, &lo1, &hi1);
                    }
                    uint32_t af[4]; /* rows r0 / r0 + 8 at K 32 kb + 4t.. (af[0] / af[1]) and 32 kb + 16 + 4t.. */
                    decode_frag(wa, wc, lo0, hi0, lo1, hi1, af);
                    const int cl = ((2 * kb) ^ g) * 16, ch = ((2 * kb + 1) ^ g) * 16;
                    *(uint32_t *)(l0 + cl) = af[0];
                    *(uint32_t *)(l1 + cl) = af[1];
                    *(uint32_t *)(l0 + ch) = af[2];
                    *(uint32_t *)(l1 + ch) = af[3];
                }
            }
            if (pt == 0) *(volatile uint32_t *)(buf + C::F_OFF) = (uint32_t)fold;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the decode's writes and the copies -> wgmma */
            mbar_arrive(bar_full + 8 * s);
        };
        int ipass0 = 0, iks = 0; /* the next load's pass and group */
        for (int q = 0; q < nq + C::LA; q++) {
            if (q < nq) {
                issue(q, ipass0, iks);
                if (++iks == ngrp) iks = 0, ipass0 += TOK;
            }
            cp_async_commit(); /* one group a q (empty past nq): wait_group LA below = load q - LA landed */
            if (q >= C::LA) {
                cp_async_wait<C::LA>();
                decode(q - C::LA);
            }
        }
        cp_async_wait<0>();
        return;
    }

    /* ================= consumer warpgroups ================= */
    const int   cw = warp - 4, wgi = cw >> 2, sl = cw; /* band slot cw = 4 wgi + warp in the warpgroup */
    const int   band = band0 + sl;
    const bool  bv = band < nbands;
    const float osc = a.oscale ? a.oscale[e] : 1.0f;
    float       acc[ND], tmp[ND];
    int         q = 0; /* the next stage load */
    for (int pass0 = 0; pass0 < m; pass0 += TOK) {
#pragma unroll
        for (int j = 0; j < ND; j++) acc[j] = tmp[j] = 0.0f;
        for (int ks = 0; ks < ngrp; ks++, q++) {
            const int s = q % STAGES;
            mbar_wait(bar_full + 8 * s, (q / STAGES) & 1);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const unsigned char *buf = ws_smem + s * C::STAGE_B;
            const uint32_t       xb = sbase + (uint32_t)(s * C::STAGE_B), ab = xb + (uint32_t)(C::A_OFF + wgi * 64 * 128);
            const int            fold = (int)*(const volatile uint32_t *)(buf + C::F_OFF);
            const uint32_t       c0 = *(const uint32_t *)(buf + C::S_OFF + (sl * 16 + g) * 4);
            const uint32_t       c1 = *(const uint32_t *)(buf + C::S_OFF + (sl * 16 + g + 8) * 4);
            if (fold) { /* one chain of 4 MMAs, then the group's promotion */
                wg8_fence(tmp);
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kb = 0; kb < 4; kb++) wgmma_fp8_ss_t<TOK>::run(tmp, wg8_desc(ab, kb), wg8_desc(xb, kb), kb);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                wg8_fence(tmp);
                const float f0 = ldexpf(1.0f, (int)fm_fp8mma_maxb(c0) - 133); /* 2^(c - 127 - 6) */
                const float f1 = ldexpf(1.0f, (int)fm_fp8mma_maxb(c1) - 133);
#pragma unroll
                for (int n = 0; n < TOK / 8; n++) {
                    const float2 xs = a.xs_per_128 ? *(const float2 *)(buf + C::XS_OFF + (n * 8 + 2 * t) * 4)
                                                   : make_float2(1.0f, 1.0f);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int j = 4 * n + i;
                        acc[j] = fmaf(tmp[j] * ((j & 2) ? f1 : f0), (j & 1) ? xs.y : xs.x, acc[j]);
                    }
                }
            } else { /* a block at a time from zero, times its scale (exact) */
#pragma unroll
                for (int kb = 0; kb < 4; kb++) {
                    wg8_fence(tmp);
                    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
                    wgmma_fp8_ss_t<TOK>::run(tmp, wg8_desc(ab, kb), wg8_desc(xb, kb), 0);
                    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                    wg8_fence(tmp);
                    const float sw0 = fm_fp8mma_ue8m0(c0 >> (8 * kb) & 0xffu), sw1 = fm_fp8mma_ue8m0(c1 >> (8 * kb) & 0xffu);
#pragma unroll
                    for (int n = 0; n < TOK / 8; n++) {
                        const float2 xs = a.xs_per_128 ? *(const float2 *)(buf + C::XS_OFF + (n * 8 + 2 * t) * 4)
                                                       : make_float2(1.0f, 1.0f);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const int j = 4 * n + i;
                            acc[j] = fmaf(tmp[j], ((j & 2) ? sw1 : sw0) * ((j & 1) ? xs.y : xs.x), acc[j]);
                        }
                    }
                }
            }
            mbar_arrive(bar_empty + 8 * s); /* this thread's MMAs (waited for) and reads of the stage are done */
        }
        /* accumulator j: row (feature) 16 x warp-in-warpgroup + g + 8 x ((j >> 1) & 1) of tile wgi,
         * token 8 x (j >> 2) + 2t + (j & 1); epilogue()'s operations, its loads once a token / column */
        if (bv) {
            const float b0 = a.bias ? __ldg(a.bias + (size_t)e * a.N + band * 16 + g) : 0.0f;
            const float b1 = a.bias ? __ldg(a.bias + (size_t)e * a.N + band * 16 + g + 8) : 0.0f;
#pragma unroll
            for (int n = 0; n < TOK / 8; n++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = pass0 + n * 8 + 2 * t + i;
                    if (r >= m) continue;
                    const int   row = row0 + r;
                    const float xr = a.xs_per_128 ? 1.0f : __ldg(a.xs + (size_t)row * a.ldxs);
                    const float rw = a.row_weight ? __ldg(a.row_weight + row) : 1.0f;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int j = 4 * n + 2 * h + i, col = band * 16 + g + 8 * h;
                        float     v = (a.xs_per_128 ? acc[j] : acc[j] * xr) * osc;
                        if (a.bias) v += h ? b1 : b0;
                        if (a.row_weight) v *= rw;
                        a.y[(size_t)row * a.N + col] = v;
                    }
                }
        }
    }
#else
    (void)a; /* not launched: fm_fp8mma_launch checks the device and the kernel's code */
#endif
}

/* 0 where this kernel can run on a device of capability cc (wg_here's rule: sm_90 with the
 * kernel's sm_90a code); else cudaErrorNotSupported or the query's error */
template <int TOK, int CW, int STAGES>
int ws_here(int cc)
{
    if (cc != 90) return (int)cudaErrorNotSupported; /* wgmma: sm_90a only */
    cudaFuncAttributes fa;
    const cudaError_t  e = cudaFuncGetAttributes(&fa, fp8mma_ws_kernel<TOK, CW, STAGES>);
    if (e != cudaSuccess) return (int)e;
    return fa.ptxVersion == 90 && fa.binaryVersion == 90 ? 0 : (int)cudaErrorNotSupported;
}

/* launch one warp-specialized kernel where ws_here allows it, shared memory as
 * fm_fp8mma_smem_bytes says */
template <int TOK, int CW, int STAGES>
int launch_ws(const fm_fp8mma_args &a, size_t smem, int cc, cudaStream_t s)
{
    using C = ws_cfg<TOK, CW, STAGES>;
    if ((size_t)C::SMEM != smem) return (int)cudaErrorAssert;
    cudaError_t e = (cudaError_t)ws_here<TOK, CW, STAGES>(cc);
    if (e != cudaSuccess) return (int)e;
    if ((e = cudaFuncSetAttribute(fp8mma_ws_kernel<TOK, CW, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem)) != cudaSuccess)
        return (int)e;
    const dim3 grid((unsigned)((a.N / 16 + C::BANDS - 1) / C::BANDS), (unsigned)a.E);
    fp8mma_ws_kernel<TOK, CW, STAGES><<<grid, C::THREADS, smem, s>>>(a);
    return (int)cudaGetLastError();
}
