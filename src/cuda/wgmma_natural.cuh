/* wgmma_natural.cuh - the single-role wgmma kernel: X in its natural column
 * order (see gemm_wgmma.cu). Every warp loads (16-byte loads, a 4x4 word
 * transpose into the swizzled core-matrix layout, one stage ahead), decodes its
 * weights and issues the MMAs; one CTA barrier per stage. BF16 outputs leave
 * through the drained stage buffers when wg_staged allows (after a CTA barrier:
 * every warp's MMAs waited for, no copy in flight), the others from the
 * registers. Included inside gemm_wgmma.cu's anonymous namespace. */
#pragma once

/* The kernel's body (OSS: gpt-oss's epilogues, kernel_common.cuh), in wgmma_kernel and
 * wgmma_oss_kernel below. */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool OSS>
__device__ __forceinline__ void wgmma_body(const fm_gemm_params &p, int nfb, const fm_gemm_oss &o)
{
#ifdef FM_WGMMA_BODY
    constexpr int TOK = 8 * NT;          /* tokens per pass = wgmma N */
    constexpr int CPS = KC / 64;         /* prepacked chunks per stage */
    constexpr int W_OFF = FM_WGMMA_W_OFF(NT, KC); /* X tile of a stage: swizzled K-major lines */
    constexpr int S_OFF = FM_WGMMA_S_OFF(WARPS, MT, NT, KC);
    constexpr int STAGE_B = FM_WGMMA_STAGE_BYTES(WARPS, MT, NT, KC); /* fm_tile_layout.h: 1 KB swizzle atoms */
    extern __shared__ __align__(1024) unsigned char smem[];

    pdl_trigger(); /* PDL: the next grid may take the SM slots this one frees */
    pdl_wait();    /* ... and this one reads nothing before the previous grid completes */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    int e = -1, local = 0;
    find_tile(p, nfb, TOK, lane, e, local);
    if (e < 0) return; /* the same answer in every warp: the whole CTA leaves */
    const int row0 = p.offsets[e], m = min(p.offsets[e + 1], p.max_rows) - row0;
    const int npass = (m + TOK - 1) / TOK;
    const int fb = local / npass, pass0 = (local % npass) * TOK;
    const int rows = min(TOK, m - pass0);

    /* ---- this warp's bands: warp wl of warpgroup wg holds rows 16*wl.. of each m64 tile */
    const int  wg = warp >> 2, wl = warp & 3;
    const int  KB = p.kp / 64, nks = (p.kp + KC - 1) / KC;
    const int  nbands = p.n / 16;
    const bool swiglu = p.epi == FM_CUDA_EPI_SWIGLU;
    int        band[MT];
    bool       bvalid[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (swiglu) { /* MT == 2 (launcher): tile 0 gate rows, tile 1 the matching up rows */
            int gb = (fb * (WARPS / 4) + wg) * 4 + wl;
            band[i] = gb + (i ? nbands / 2 : 0);
            bvalid[i] = gb < nbands / 2;
        } else {
            band[i] = ((fb * (WARPS / 4) + wg) * MT + i) * 4 + wl;
            bvalid[i] = band[i] < nbands;
        }
    }
    const uint4    *wd = (const uint4 *)p.wdata + (size_t)e * nbands * KB * 32;
    const uint16_t *ws = (const uint16_t *)p.wscale + (size_t)e * nbands * KB * 32;
    const float     osc = p.oscale[e];
    const uint16_t *xg = p.x + (size_t)(row0 + pass0) * p.k;

    /* X, in the prepack's K order (see the header): pair (t, s, h) of a 64-K chunk,
     * K = 16t + 4s + 2h (+1), goes to core matrix 2s + h (MMA step s, its K half h),
     * 4-byte column t. Natural 16-byte chunk u (K 8u..8u+7) word w is pair 4u + w:
     * core 4(u%2) + w, column u/2. So a thread loads the 4 even (or odd) chunks of
     * one token row and chunk, 16 B each (registers, one stage ahead), transposes
     * the 4x4 words and stores 4 whole core-matrix rows of 16 B: 8 threads of
     * consecutive tokens fill 128 contiguous bytes (no bank conflict). Tokens past
     * the pass and K past p.k are zeros. */
    /* 128-byte swizzle, K-major: the 64 K of one token row (8 core-matrix columns
     * j of 16 B) fill one 128-byte line; 8 token rows = one 1 KB atom; column j of
     * row r sits at 16 * (j ^ (r % 8)), so 8 rows of one column hit 8 different
     * bank groups, for these stores and for the tensor cores' reads.
     * Stage tile = [chunk c64][token group][8 rows][128 B]. */
    auto x_row_off = [](int c64, int r) { return c64 * TOK * 128 + r * 128; };
    auto x_col_off = [](int j, int r8) { return (j ^ r8) * 16; };
    constexpr int XITEMS = TOK * CPS * 2;                       /* (token, chunk, parity) */
    constexpr int XI = (XITEMS + WARPS * 32 - 1) / (WARPS * 32); /* per thread */
    uint4         xr[XI][4];
    auto x_fetch = [&](int ks) {
#pragma unroll
        for (int it = 0; it < XI; it++) {
            int item = threadIdx.x + it * WARPS * 32;
            int r8 = item & 7, par = (item >> 3) & 1, rest = item >> 4, c64 = rest % CPS, rg = rest / CPS;
            int r = rg * 8 + r8, k0 = ks * KC + c64 * 64 + par * 8;
            bool rok = item < XITEMS && r < rows;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int k = k0 + 16 * j;
                xr[it][j] = rok && k < p.k ? __ldg((const uint4 *)(xg + (size_t)r * p.k + k)) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto x_store = [&](int ks) {
        unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int it = 0; it < XI; it++) {
            int item = threadIdx.x + it * WARPS * 32;
            if (item >= XITEMS) continue;
            int r8 = item & 7, par = (item >> 3) & 1, rest = item >> 4, c64 = rest % CPS, rg = rest / CPS;
            unsigned char *row = buf + x_row_off(c64, rg * 8 + r8);
            int            j0 = par * 4;
            *(uint4 *)(row + x_col_off(j0 + 0, r8)) = make_uint4(xr[it][0].x, xr[it][1].x, xr[it][2].x, xr[it][3].x);
            *(uint4 *)(row + x_col_off(j0 + 1, r8)) = make_uint4(xr[it][0].y, xr[it][1].y, xr[it][2].y, xr[it][3].y);
            *(uint4 *)(row + x_col_off(j0 + 2, r8)) = make_uint4(xr[it][0].z, xr[it][1].z, xr[it][2].z, xr[it][3].z);
            *(uint4 *)(row + x_col_off(j0 + 3, r8)) = make_uint4(xr[it][0].w, xr[it][1].w, xr[it][2].w, xr[it][3].w);
        }
    };
    /* the weights and scale bytes of a stage, by cp.async */
    auto load_stage = [&](int ks) {
        unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int c = 0; c < CPS; c++) {
            int kb = ks * CPS + c;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                bool   ok = bvalid[i] && kb < KB;
                size_t off = ok ? ((size_t)band[i] * KB + kb) * 32 : 0;
                int    sl = (warp * MT + i) * CPS + c;
                cp_async16(buf + W_OFF + sl * 512 + lane * 16, wd + off + lane, ok ? 16 : 0);
                if (lane < 4)
                    cp_async16(buf + S_OFF + sl * 64 + lane * 16, (const unsigned char *)(ws + off) + lane * 16,
                               ok ? 16 : 0);
            }
        }
    };

    float acc[MT][TOK / 2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < TOK / 2; j++) acc[i][j] = 0.0f;

    typedef stage_regs_t<CPS, MT> stage_regs;
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    auto dequant = [&](int ks, stage_regs &a) { wg_dequant(smem + (ks % STAGES) * STAGE_B, W_OFF, S_OFF, warp, lane, p, a); };
    auto issue = [&](int ks, stage_regs &a) { wg_issue<TOK, KC>(smem0 + (ks % STAGES) * STAGE_B, acc, a); };

    /* Software pipeline: the tensor cores run stage ks (A from registers `a`, X from
     * buffer ks) while the warps decode stage ks+1 into `an`; buffers ks+2 .. ks+STAGES-1
     * are in flight. The load issued at step ks refills buffer ks-1, whose MMAs every
     * warpgroup waited for before the barrier. One cp.async group is committed per
     * prologue stage and per iteration (empty ones included), so stage ks+1 has landed
     * when at most STAGES-3 groups are pending. */
    static_assert(STAGES >= 4, "stage ks in the MMAs, ks+1 in decode, ks+2 being stored, ks-2's buffer reused");
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nks) load_stage(s);
        cp_async_commit();
    }
    x_fetch(0);
    x_store(0);
    if (nks > 1) {
        x_fetch(1);
        x_store(1);
    }
    if (nks > 2) x_fetch(2);
    cp_async_wait<STAGES - 2>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* stores and cp.async data -> tensor-core reads */
    __syncthreads();
    stage_regs a, an;
    dequant(0, a);
    for (int ks = 0; ks < nks; ks++) {
        issue(ks, a);
        if (ks + 1 < nks) {
            /* X of stage ks+2 into buffer ks+2-STAGES <= ks-2, whose MMAs every
             * warpgroup finished before the previous barrier */
            if (ks + 2 < nks) x_store(ks + 2);
            if (ks + 3 < nks) x_fetch(ks + 3);
            cp_async_wait<STAGES - 3>();
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads(); /* stage ks+1 visible; every warpgroup finished the MMAs of ks-1 */
            if (ks + STAGES - 1 < nks) load_stage(ks + STAGES - 1);
            cp_async_commit();
            dequant(ks + 1, an);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        /* keep `a` and `acc` alive until the wait: `an` cannot take a's registers
         * while the tensor cores still read them */
        wg_fence_acc(acc);
        wg_fence_regs(a);
        a = an;
    }
    cp_async_wait<0>();

    if (wg_staged<WARPS, MT, NT, STAGES * STAGE_B>(p)) { /* BF16 output through the stage buffers */
        /* every warp has waited for its MMAs (wait_group 0: their shared-memory reads
         * done) and for its copies, and its last decode and X stores are behind it */
        __syncthreads();
        wg_epilogue_staged<OSS, WARPS, MT, NT, WARPS * 32>(p, o, smem, fb, warp, bvalid, row0 + pass0, rows, e, osc, g, t,
                                                      threadIdx.x, 0, swiglu ? WARPS * MT * 8 : WARPS * MT * 16, acc,
                                                      [] { __syncthreads(); });
        return;
    }
    /* accumulator j of a thread: 8-token group j/4, element j%4 of the m16n8 C layout */
    epilogue<OSS, MT, NT>(p, o, band, bvalid, row0 + pass0, rows, e, osc, g, t,
                          [&](int i, int n, int q) { return acc[i][n * 4 + q]; });
#else
    (void)p;
    (void)nfb;
    (void)o;
#endif
}

template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, 1) wgmma_kernel(const fm_gemm_params p, int nfb)
{
    wgmma_body<WARPS, MT, NT, KC, STAGES, false>(p, nfb, fm_gemm_oss{});
}

/* the same with gpt-oss's epilogues (p.bias, p.act): launched when the call has them */
template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, 1) wgmma_oss_kernel(const fm_gemm_params p, int nfb, const fm_gemm_oss o)
{
    wgmma_body<WARPS, MT, NT, KC, STAGES, true>(p, nfb, o);
}
