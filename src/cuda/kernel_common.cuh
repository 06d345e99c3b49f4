/* kernel_common.cuh - device helpers shared by the FP4 grouped-GEMM kernels
 * (gemm_mma.cuh: mma.sync, gemm_wgmma.cu: wgmma): BF16 math, cp.async, the
 * E2M1 -> BF16 dequantization of one prepacked word, and the two epilogues:
 * epilogue (every epilogue, stores from the registers) and epilogue_staged
 * (BF16 outputs, through the idle stage buffers as 16-byte row segments). */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"

namespace fm_kc {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
    uint32_t d;
    /* fma with -0 addend: exact product, subnormal a supported (sm_80+) */
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (the .L2::256B prefetch hint was measured: 1-3 % slower at 1-8 rows, bench/HISTORY.md, fifth session) */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/* 4-byte copy (.ca: the neighbouring bytes of the sector are read next from L1) */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, int src_bytes)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* The four A registers of one mma step from prepacked word w (see prepack.c). */
__device__ __forceinline__ void dequant_step(uint32_t w, uint32_t s_lo, uint32_t s_hi, uint32_t (&a)[4])
{
    const uint32_t M = 0x81C081C0u; /* 9 integer ops for 8 weights: the bit layout of prepack.c */
    a[0] = bf16x2_mul((w & 0x80C080C0u) | ((w << 8) & 0x01000100u), s_lo);
    a[1] = bf16x2_mul((w << 4) & M, s_hi);
    a[2] = bf16x2_mul(__funnelshift_l(w, w, 14) & M, s_lo);
    a[3] = bf16x2_mul(__funnelshift_l(w, w, 10) & M, s_hi);
}

/* One prepacked 16-row x 64-K weight chunk of a stage for this lane (slot = the
 * chunk's index in the stage: 512 B of E2M1 at w_off, 64 B of scale codes at s_off)
 * and its two scale multipliers: rows g (s_lo) and g + 8 (s_hi) of the band, the
 * code turned into the BF16x2 factor that dequant_step expects (p.sc_mul/sc_add:
 * NVFP4 E4M3 or MXFP4 E8M0, prepack.c). */
__device__ __forceinline__ void load_chunk(const unsigned char *buf, int w_off, int s_off, int slot, int lane,
                                           const fm_gemm_params &p, uint4 &wq, uint32_t &s_lo, uint32_t &s_hi)
{
    wq = *(const uint4 *)(buf + w_off + slot * 512 + lane * 16);
    const uint32_t sc = *(const uint16_t *)(buf + s_off + slot * 64 + lane * 2);
    s_lo = (sc & 0xFFu) * p.sc_mul + p.sc_add;
    s_hi = (sc >> 8) * p.sc_mul + p.sc_add;
}

/* Programmatic dependent launch (sm_90+; no-ops on sm_80, and when the grid was launched
 * without the attribute). pdl_trigger: the next grid in the stream may be scheduled once
 * every CTA of this one has run it (each CTA runs it first: the next grid's CTAs then take
 * the SM slots this grid's last CTAs free). pdl_wait: block until the previous grid has
 * completed and its writes are visible; nothing the previous grid may write is read (and
 * nothing is written) before it. */
__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait()
{
    /* FM_TEST_PDL_NO_WAIT: a build that must fail test_cuda_pdl (the test's own check) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FM_TEST_PDL_NO_WAIT)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
} // namespace fm_kc

/* Launch fn(args...) with programmatic stream serialization (the PDL attribute): it may
 * start while the previous kernel in the stream finishes (the kernels call pdl_trigger and
 * pdl_wait). Host side; compute capability 9.0+ (fm_cuda_gemm sets pdl only there). */
static inline cudaError_t fm_launch_pdl(const void *fn, dim3 grid, dim3 block, size_t smem, void *stream,
                                        void **args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, fn, args);
}

namespace fm_kc {

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

/* The expert's row of p.bias (NULL when the layer has none): FP32 [n_experts][p.n]. */
__device__ __forceinline__ const float *expert_bias(const fm_gemm_params &p, const fm_gemm_oss &o, int e)
{
    return o.bias ? o.bias + (size_t)e * p.n : nullptr;
}

/* The epilogues' OSS template flag: the gpt-oss kernels (the *_oss_* kernels of each
 * family), which read fm_gemm_oss o (cuda_internal.h); without it o is not read and the
 * epilogues are the plain layer's, expression for expression, so the kernels without it
 * keep their machine code (registers and spills: tests/test_kernel_resources.c). A
 * runtime branch in the shared epilogue moved ptxas's allocation of every kernel (up to
 * +56 registers, new spills in the work-list kernel), hence separate kernels.
 *
 * h of one gate/up pair of the SWIGLU epilogue: gv, uv the FC1 outputs (osc applied) of
 * gate feature col and up feature col + n/2; b13 the expert's bias row (expert_bias) or
 * NULL. The CPU's fm_moe_expert_act (src/moe/shared.c): the bias first, then plain
 * silu(g) * u, or gpt-oss's clamps as comparisons (not fminf: a NaN stays NaN, as
 * torch.clamp) and (u' + 1) * g' * sigmoid(1.702 g'). */
__device__ __forceinline__ float swiglu_out(const fm_gemm_params &p, const fm_gemm_oss &o, const float *b13, int col,
                                            float gv, float uv)
{
    if (b13) {
        gv += __ldg(b13 + col);
        uv += __ldg(b13 + p.n / 2 + col);
    }
    if (o.act != FM_ACT_SWIGLU_GPTOSS) return silu(gv) * uv;
    const float L = o.act_limit;
    gv = gv > L ? L : gv;
    uv = uv > L ? L : uv < -L ? -L : uv;
    return (uv + 1.0f) * (gv / (1.0f + __expf(-1.702f * gv)));
}

/* FINALIZE's weighted FC2 output: v (the accumulator, osc not applied) x rw (the row's
 * weight x osc), or with the expert's bias row b2 (FP32, added before the weight as the
 * CPU's y + b2 then weight x y): (v x osc + b2[col]) x w. */
__device__ __forceinline__ float finalize_out(const float *b2, int col, float v, float osc, float w, float rw)
{
    return b2 ? (v * osc + __ldg(b2 + col)) * w : v * rw;
}


/* Write one pass's results. acc(i, n, q) is the FP32 accumulator of band i
 * (MT per warp), 8-token group n (NT per pass), element q of the m16n8 C
 * fragment: feature g + 8*(q>>1) of the band, token 8n + 2t + (q&1). With
 * SwiGLU the first MT/2 bands are gate rows and the last MT/2 the matching up
 * rows. rows = valid tokens of the pass, rbase = first permuted row. */
/* fm_cuda_kpack_col on the device */
__device__ __forceinline__ int kpack_col(int c)
{
    int n = c & 63, pr = n >> 1;
    return (c & ~63) + (pr & 7) * 8 + (pr >> 3) * 2 + (n & 1);
}

template <bool OSS, int MT, int NT, class Acc>
__device__ __forceinline__ void epilogue(const fm_gemm_params &p, const fm_gemm_oss &o, const int (&band)[MT],
                                         const bool (&bvalid)[MT], int rbase, int rows, int e, float osc, int g, int t,
                                         Acc acc)
{
    const bool   swiglu = p.epi == FM_CUDA_EPI_SWIGLU;
    const float *bias = OSS ? expert_bias(p, o, e) : nullptr;
    const float  oscu = swiglu ? p.oscale[p.n_experts + e] : osc; /* the up rows' (fm_cuda_weights.d_oscale) */
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int tok = n * 8 + 2 * t + (q & 1);
            if (tok >= rows) continue;
            int r = rbase + tok;
            int fo = g + 8 * (q >> 1);
            if (swiglu) {
                __nv_bfloat16 *y = (__nv_bfloat16 *)p.y + (size_t)r * (p.n / 2);
#pragma unroll
                for (int i = 0; i < MT / 2; i++) {
                    if (!bvalid[i]) continue;
                    float gv = acc(i, n, q) * osc, uv = acc(i + MT / 2, n, q) * oscu;
                    int   col = band[i] * 16 + fo;
                    y[p.y_packed ? kpack_col(col) : col] =
                        __float2bfloat16(OSS ? swiglu_out(p, o, bias, col, gv, uv) : silu(gv) * uv);
                }
            } else if (p.epi == FM_CUDA_EPI_NONE) {
                __nv_bfloat16 *y = (__nv_bfloat16 *)p.y + (size_t)r * p.n;
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (bvalid[i]) {
                        int col = band[i] * 16 + fo;
                        y[p.y_packed ? kpack_col(col) : col] = __float2bfloat16(acc(i, n, q) * osc);
                    }
            } else if (p.epi == FM_CUDA_EPI_FINALIZE) {
                float *y = (float *)p.y + (size_t)p.row_token[r] * p.n;
                float  w = p.row_weight[r], rw = w * osc;
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (bvalid[i]) {
                        int col = band[i] * 16 + fo;
                        atomicAdd(&y[col], OSS ? finalize_out(bias, col, acc(i, n, q), osc, w, rw) : acc(i, n, q) * rw);
                    }
            } else { /* FINALIZE_DET: weighted rows to scratch, reduced in slot order later */
                float *y = p.scratch + (size_t)r * p.n;
                float  w = p.row_weight[r], rw = w * osc;
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (bvalid[i]) {
                        int col = band[i] * 16 + fo;
                        y[col] = OSS ? finalize_out(bias, col, acc(i, n, q), osc, w, rw) : acc(i, n, q) * rw;
                    }
            }
        }
}

/* Bytes of epilogue_staged's tile: tok token rows of fs features (BF16), each
 * row padded by 16 B (a warp's 2-byte writes of 4 token rows x 8 features then
 * fall in distinct banks for natural columns). */
constexpr int staged_tile_bytes(int fs, int tok) { return tok * (2 * fs + 16); }
/* the same for FINALIZE_DET's FP32 rows */
constexpr int staged_tile_bytes_f32(int fs, int tok) { return tok * (4 * fs + 16); }

/* BF16 outputs (NONE, SWIGLU) and FINALIZE_DET's FP32 rows (weighted by the
 * row's router weight, to p.scratch, row stride 4*FS + 16 bytes in smem:
 * staged_tile_bytes_f32) of one pass through shared memory: the CTA's
 * [tokens][output columns] tile goes to smem (row stride 2*FS + 16 bytes; column
 * order as written: natural, or the prepack K order (kpack_col) for y_packed,
 * which needs the CTA's output columns to be whole 64-column blocks), then every
 * valid token row leaves as 16-byte segments, where epilogue() makes 2-byte
 * stores over four token rows per warp instruction.
 *  FS: features of the CTA (output columns: FS, or FS/2 with SwiGLU);
 *  blk: the CTA's output column block (first output column blk * columns);
 *  lcol(i, sw): the CTA-local output column of feature 0 of band i, sw = false;
 *    with SwiGLU (sw = true, a literal, so that the caller's choice folds) of the
 *    gate/up pair i, i + MT/2, for i < MT/2; bands with bvalid[i] false (past N)
 *    are neither written nor stored;
 *  acc(i, n, q), g, t, rbase, rows, osc: as in epilogue();
 *  run by NTHR threads, tid = 0..NTHR-1 among them; bar() is a barrier among
 *    exactly those threads (between the smem writes and the row reads); they
 *    write the bands of their own warps and store the CTA-local output columns
 *    [c0, c0 + cn) of the tile (c0, cn multiples of 64 for y_packed): the whole
 *    tile (0, all) when the group is the CTA's every MMA warp, or the columns of
 *    its own bands (a warpgroup of the warp-specialized kernel: no barrier with
 *    the other warpgroup, whose columns are other bytes).
 * The caller guarantees that nothing reads or writes smem[0, staged_tile_bytes(FS,
 * 8*NT)) any more when the first of them writes (its MMAs waited for, its copies
 * landed, then a barrier), and that y is 16-byte aligned. */
template <bool OSS, int FS, int MT, int NT, int NTHR, class Acc, class Col, class Bar>
__device__ __forceinline__ void epilogue_staged(const fm_gemm_params &p, const fm_gemm_oss &o, unsigned char *smem,
                                                int blk, const bool (&bvalid)[MT], int rbase, int rows, int e, float osc,
                                                int g, int t, int tid, int c0, int cn, Acc acc, Col lcol, Bar bar)
{
    const float *bias = OSS ? expert_bias(p, o, e) : nullptr;
    if (p.epi == FM_CUDA_EPI_FINALIZE_DET) { /* FP32 rows x router weight -> scratch */
        constexpr int RS = 4 * FS + 16;
        const int     col0 = blk * FS;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int tok = n * 8 + 2 * t + (q & 1), fo = g + 8 * (q >> 1);
                if (tok >= rows) continue;
                const float w = p.row_weight[rbase + tok], rw = w * osc;
                float      *row = (float *)(smem + tok * RS);
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (bvalid[i]) {
                        const int lc = lcol(i, false) + fo;
                        row[lc] = OSS ? finalize_out(bias, col0 + lc, acc(i, n, q), osc, w, rw) : acc(i, n, q) * rw;
                    }
            }
        bar();
        const int vpr = cn / 4; /* 16-byte segments per token row in the group's columns */
        for (int v = tid; v < rows * vpr; v += NTHR) {
            const int r = v / vpr, c4 = c0 + (v - r * vpr) * 4;
            if (col0 + c4 >= p.n) continue; /* bands past N */
            *(uint4 *)(p.scratch + (size_t)(rbase + r) * p.n + col0 + c4) = *(const uint4 *)(smem + r * RS + c4 * 4);
        }
        return;
    }
    constexpr int RS = 2 * FS + 16;
    const bool    swiglu = p.epi == FM_CUDA_EPI_SWIGLU;
    const float   oscu = swiglu ? p.oscale[p.n_experts + e] : osc; /* the up rows' (fm_cuda_weights.d_oscale) */
    const int     fout = swiglu ? FS / 2 : FS, width = swiglu ? p.n / 2 : p.n, col0 = blk * fout;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const bool use_stm = !p.y_packed && NT % 2 == 0;
    if (use_stm) {
        /* sm_90: stmatrix .trans, four 8x8 BF16 matrices a warp instruction (8 values a
         * thread instead of one): the m16n8 accumulator of 8 tokens x 16 features is two
         * 8x8 matrices (features g, g + 8 by rows; tokens 2t, 2t + 1 a register), stored
         * transposed = 8 token rows of 8 features (16 B each); lane L gives the row
         * address of matrix L / 8: 8-token group n + L / 16, feature half (L / 8) % 2 */
        const int lane = 4 * g + t, nbands = swiglu ? MT / 2 : MT;
        /* element q of the m16n8 fragment is feature g + 8 (q >> 1) of the band */
        auto      val = [&](int i, int n, int q) {
            if (!OSS) return swiglu ? silu(acc(i, n, q) * osc) * (acc(i + MT / 2, n, q) * oscu) : acc(i, n, q) * osc;
            return swiglu ? swiglu_out(p, o, bias, col0 + lcol(i, true) + g + 8 * (q >> 1), acc(i, n, q) * osc,
                                       acc(i + MT / 2, n, q) * oscu)
                          : acc(i, n, q) * osc;
        };
        auto pack = [](float lo, float hi) {
            __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
            return *(uint32_t *)&v;
        };
        const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (i >= nbands || !bvalid[i]) continue; /* the same in every lane: bands are per warp */
            const int col = (swiglu ? lcol(i, true) : lcol(i, false)) + 8 * ((lane >> 3) & 1);
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                const uint32_t a = s0 + (uint32_t)((8 * (n + (lane >> 4)) + (lane & 7)) * RS + col * 2);
                asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(a),
                             "r"(pack(val(i, n, 0), val(i, n, 1))), "r"(pack(val(i, n, 2), val(i, n, 3))),
                             "r"(pack(val(i, n + 1, 0), val(i, n + 1, 1))), "r"(pack(val(i, n + 1, 2), val(i, n + 1, 3)))
                             : "memory");
            }
        }
    }
#else
    constexpr bool use_stm = false;
#endif
    if (!use_stm) {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int tok = n * 8 + 2 * t + (q & 1), fo = g + 8 * (q >> 1);
                __nv_bfloat16 *row = (__nv_bfloat16 *)(smem + tok * RS);
                if (swiglu) {
#pragma unroll
                    for (int i = 0; i < MT / 2; i++)
                        if (bvalid[i]) {
                            int lc = lcol(i, true) + fo;
                            row[p.y_packed ? kpack_col(lc) : lc] = __float2bfloat16(
                                OSS ? swiglu_out(p, o, bias, col0 + lc, acc(i, n, q) * osc, acc(i + MT / 2, n, q) * oscu)
                                    : silu(acc(i, n, q) * osc) * (acc(i + MT / 2, n, q) * oscu));
                        }
                } else {
#pragma unroll
                    for (int i = 0; i < MT; i++)
                        if (bvalid[i]) {
                            int lc = lcol(i, false) + fo;
                            row[p.y_packed ? kpack_col(lc) : lc] = __float2bfloat16(acc(i, n, q) * osc);
                        }
                }
            }
    }
    bar();
    const int vpr = cn / 8; /* 16-byte segments per token row in the group's columns */
    for (int v = tid; v < rows * vpr; v += NTHR) {
        const int r = v / vpr, c8 = c0 + (v - r * vpr) * 8;
        if (col0 + c8 >= width) continue; /* bands past N (a segment lies in one band; packed: in one 64-block) */
        *(uint4 *)((__nv_bfloat16 *)p.y + (size_t)(rbase + r) * width + col0 + c8) = *(const uint4 *)(smem + r * RS + c8 * 2);
    }
}

} // namespace fm_kc
