/* wgmma_ws.cuh - the warp-specialized wgmma kernel for packed X (see
 * gemm_wgmma.cu). Included inside gemm_wgmma.cu's anonymous namespace. */
#pragma once

/* Warp-specialized version: one producer warpgroup (warps 0-3) streams the stages
 * (token tile, already in the prepack's K order, and weights and scale bytes,
 * all by 16-byte cp.async; 128-byte swizzle), each completing on the stage's
 * `full` mbarrier (cp.async.mbarrier.arrive); WARPS consumer warps (WARPS/4
 * warpgroups) decode and run the MMAs: stage k is decoded into one of two
 * register sets while the MMAs of stage k-1 may still run, and stage k-1's
 * buffer is handed back (`empty` mbarrier) once they have. No CTA-wide barrier
 * in the main loop. With two (three) consumer warpgroups, setmaxnreg moves registers
 * from the producer (56) to the consumers (224; 152 with three). BF16 outputs leave through
 * shared memory when wg_staged allows, each consumer warpgroup staging and
 * storing its own output columns behind its own named barrier (2 + warpgroup),
 * the others from the registers.
 * PERSIST = false: one CTA per tile; the staged output reuses the drained stage
 * buffers (the producer has issued exactly nks stage loads, each waited for by
 * every consumer on its `full` mbarrier, and leaves after them).
 * PERSIST = true: one CTA per SM loops over tiles blockIdx.x + i * gridDim.x;
 * the stage ring runs on across tiles (stage load `it` counts over all of the
 * CTA's tiles), so the producer loads the next tile's stages while the consumers
 * run the last one's epilogue, and the staged output has a buffer of its own
 * after the stages (fm_smem_wgmma counts it). No CTA launch, barrier set-up,
 * tile scan from expert 0 or pipeline fill per tile: what a K = 256 tile (four
 * 64-K stages) otherwise pays on every tile. */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool PERSIST, bool OSS>
__device__ __forceinline__ void wgmma_ws_body(const fm_gemm_params &p, int nfb, const fm_gemm_oss &o)
{
#ifdef FM_WGMMA_BODY
    constexpr int TOK = 8 * NT;
    constexpr int CPS = KC / 64;
    constexpr int W_OFF = FM_WGMMA_W_OFF(NT, KC);
    constexpr int S_OFF = FM_WGMMA_S_OFF(WARPS, MT, NT, KC);
    constexpr int STAGE_B = FM_WGMMA_STAGE_BYTES(WARPS, MT, NT, KC); /* fm_tile_layout.h */
    /* persistent: the staged output tile has its own buffer after the stages (the
     * producer fills the next tile's stages meanwhile); else it reuses the stages */
    constexpr int EPI_B = PERSIST ? FM_WGMMA_EPI_BYTES(WARPS, MT, NT) : 0;
    static_assert(!PERSIST || EPI_B == staged_tile_bytes(WARPS * MT * 16, TOK), "the output buffer holds the staged tile");
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t bar_full = smem0 + STAGES * STAGE_B + EPI_B, bar_empty = bar_full + 8 * STAGES;

    pdl_trigger(); /* PDL: the next grid may take the SM slots this one frees */
    pdl_wait();    /* ... and this one reads nothing before the previous grid completes */
    const int  warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int  KB = p.kp / 64, nks = (p.kp + KC - 1) / KC;
    const int  nbands = p.n / 16;
    const bool swiglu = p.epi == FM_CUDA_EPI_SWIGLU;

    /* the tile of a slot (the same answer in every warp); a persistent CTA takes
     * slots blockIdx.x, + gridDim.x, ... (the next one's stages load while the
     * consumers finish the last one) */
    int cur_e0 = 0, cur_base = 0;
    struct tile_t {
        int e, fb, row0, rows;
    };
    auto tile_at = [&](int slot, tile_t &tl) {
        int e, local;
        find_tile(p, nfb, TOK, lane, slot, e, local, cur_e0, cur_base);
        tl.e = e;
        if (e < 0) return false;
        const int r0 = p.offsets[e], m = min(p.offsets[e + 1], p.max_rows) - r0;
        const int npass = (m + TOK - 1) / TOK, pass0 = (local % npass) * TOK;
        tl.fb = local / npass;
        tl.row0 = r0 + pass0;
        tl.rows = min(TOK, m - pass0);
        return true;
    };
    const int slot_step = PERSIST ? (int)gridDim.x : 0x7FFFFFFF;
    tile_t    tl;
    if (!tile_at(blockIdx.x, tl)) return; /* the whole CTA leaves */

    /* the bands of consumer warp cw (warpgroup cw/4, rows 16*(cw%4).. of each m64 tile) */
    auto band_of = [&](int fb, int cw, int i, bool &valid) {
        int cg = cw >> 2, cl = cw & 3;
        if (swiglu) {
            int gb = (fb * (WARPS / 4) + cg) * 4 + cl;
            valid = gb < nbands / 2;
            return gb + (i ? nbands / 2 : 0);
        }
        int b = ((fb * (WARPS / 4) + cg) * MT + i) * 4 + cl;
        valid = b < nbands;
        return b;
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bar_full + 8 * s, 128);   /* every producer thread's cp.async arrival */
            mbar_init(bar_empty + 8 * s, WARPS * 32); /* every consumer thread, after its own reads */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        /* ================= producer warpgroup ================= */
        if (WARPS >= 8) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
        const int pt = threadIdx.x; /* 0..127 */
        /* Every copy of this thread, worked out once a tile: only the K offset moves
         * from stage to stage (the producer is one warp per scheduler: its issue rate
         * is what feeds the consumers). X: 16-byte chunk j of a row's 64-K block,
         * already in the prepack's K order (fm_cuda_x_pack), is core-matrix column j;
         * 8 threads copy one 128-byte line. */
        constexpr int XN = TOK * KC / 8, XPER = (XN + 127) / 128;
        constexpr int XROWS = 16 / CPS; /* rows between a thread's copies (128 threads x 8 chunks / CPS) */
        static_assert(XN <= 128 || XROWS % 8 == 0, "a thread's rows keep their swizzle phase");
        const int pj = pt & 7, prest = pt >> 3, xc64 = (prest % CPS) * 64 + pj * 8, pr = prest / CPS;
        const int xoff0 = pr * p.k + xc64;
        const int xdst0 = (prest % CPS) * TOK * 128 + pr * 128 + ((pj ^ (pr & 7)) * 16);
        /* weights: slot sl = (consumer warp, tile, chunk) of 32 x 16 B; lane = 16-byte
         * part, slots pt/32 + 4i; its 4 x 16 B of scale bytes by threads sl*4 + part */
        constexpr int SLOTS = WARPS * MT * CPS, WPER = (SLOTS + 3) / 4;
        const bool    sthr = pt < SLOTS * 4; /* this thread copies 16 B of scale bytes */
        int           it = 0;                /* stage loads issued (all tiles) */
        for (int slot = blockIdx.x;;) {
            const uint16_t      *xg = p.x + (size_t)tl.row0 * p.k;
            const uint4         *wd = (const uint4 *)p.wdata + (size_t)tl.e * nbands * KB * 32;
            const unsigned char *ws = (const unsigned char *)p.wscale + (size_t)tl.e * nbands * KB * 64;
            auto slot_src = [&](int sl, int &c, bool &bv) { /* (band*KB + chunk) of slot sl */
                c = sl % CPS;
                int b = band_of(tl.fb, sl / (CPS * MT), (sl / CPS) % MT, bv);
                return b * KB + c;
            };
            unsigned xmask = 0; /* copy i has a real token row */
#pragma unroll
            for (int i = 0; i < XPER; i++)
                if (pt + 128 * i < XN && pr + XROWS * i < tl.rows) xmask |= 1u << i;
            int      woff[WPER];
            unsigned wmask = 0;
            int      wc = 0;
#pragma unroll
            for (int i = 0; i < WPER; i++) {
                int  sl = (pt >> 5) + 4 * i, c;
                bool bv;
                int  bk = slot_src(sl < SLOTS ? sl : 0, c, bv);
                woff[i] = bk * 512 + (pt & 31) * 16;
                wc = c; /* the same for every i: 4i keeps sl % CPS (CPS <= 2) */
                if (sl < SLOTS && bv) wmask |= 1u << i;
            }
            int  soff = 0, sc_c = 0;
            bool sok = false;
            if (sthr) soff = slot_src(pt >> 2, sc_c, sok) * 64 + (pt & 3) * 16;
            for (int ks = 0; ks < nks; ks++, it++) {
                const int s = it % STAGES;
                mbar_wait(bar_empty + 8 * s, ((it / STAGES) + 1) & 1);
                unsigned char *buf = smem + s * STAGE_B;
                const bool     kin = ks * KC + xc64 < p.k;
#pragma unroll
                for (int i = 0; i < XPER; i++) {
                    if (pt + 128 * i >= XN) break;
                    bool ok = kin && ((xmask >> i) & 1);
                    int dst = xdst0 + XROWS * i * 128;
                    cp_async16(buf + dst, ok ? xg + xoff0 + (size_t)XROWS * i * p.k + ks * KC : p.x, ok ? 16 : 0);
                }
                const bool wkin = ks * CPS + wc < KB;
#pragma unroll
                for (int i = 0; i < WPER; i++) {
                    if ((pt >> 5) + 4 * i >= SLOTS) break;
                    bool ok = wkin && ((wmask >> i) & 1);
                    const unsigned char *src = (const unsigned char *)wd + woff[i] + (size_t)ks * CPS * 512;
                    cp_async16(buf + W_OFF + ((pt >> 5) + 4 * i) * 512 + (pt & 31) * 16,
                               ok ? (const void *)src : (const void *)p.x, ok ? 16 : 0);
                }
                if (sthr) {
                    bool ok = sok && ks * CPS + sc_c < KB;
                    cp_async16(buf + S_OFF + pt * 16, ok ? (const void *)(ws + soff + (size_t)ks * CPS * 64) : (const void *)p.x,
                               ok ? 16 : 0);
                }
                mbar_arrive_cp_async(bar_full + 8 * s);
            }
            if (!PERSIST || slot > 0x7FFFFFFF - slot_step) break;
            slot += slot_step;
            if (!tile_at(slot, tl)) break;
        }
        cp_async_wait<0>();
        return;
    }

    /* ================= consumer warpgroups ================= */
    /* the CTA's 65,536 registers: 128 producer threads x 56 + the consumers' share
     * (8 warps: 168 each at launch, 224 after; 12 warps: 128 each at launch, 152 after) */
    if (WARPS == 8) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    if (WARPS == 12) asm volatile("setmaxnreg.inc.sync.aligned.u32 152;");
    const int cw = warp - 4;
    typedef stage_regs_t<CPS, MT> stage_regs;
    float acc[MT][TOK / 2];
    auto  dequant = [&](int it, stage_regs &a) { wg_dequant(smem + (it % STAGES) * STAGE_B, W_OFF, S_OFF, cw, lane, p, a); };
    auto  fence_acc = [&]() { wg_fence_acc(acc); };
    auto  fence_regs = [&](stage_regs &a) { wg_fence_regs(a); };
    auto  issue = [&](int it, stage_regs &a) { wg_issue<TOK, KC>(smem0 + (it % STAGES) * STAGE_B, acc, a); };
    /* stage load `it` (k step ks of the tile): wait until it has landed, decode it,
     * issue its MMAs, then wait for the MMAs of it-1 (its may run on) and give it-1's
     * buffer back (the tile's last stage is given back after the final wait). Two
     * register sets, used alternately (the loop body is written twice). */
    auto step = [&](int it, int ks, stage_regs &cur, stage_regs &prev) {
        const int s = it % STAGES;
        mbar_wait(bar_full + 8 * s, (it / STAGES) & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async data -> tensor-core reads */
        dequant(it, cur);
        issue(it, cur);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        fence_acc();
        fence_regs(prev);
        fence_regs(cur);
        /* each thread releases it-1 after its own reads of it (the decode's shared loads
         * in the previous step, the MMAs' by the wait above): no reliance on a warp
         * barrier ordering the other lanes' reads (compute-sanitizer racecheck reported
         * WAR hazards on stage reuse with the lane-0-only release) */
        if (ks > 0) mbar_arrive(bar_empty + 8 * ((it - 1) % STAGES));
    };
    int it = 0; /* stage loads consumed (all tiles) */
    for (int slot = blockIdx.x;;) {
        int  band[MT];
        bool bvalid[MT];
#pragma unroll
        for (int i = 0; i < MT; i++) band[i] = band_of(tl.fb, cw, i, bvalid[i]);
        const float osc = p.oscale[tl.e];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < TOK / 2; j++) acc[i][j] = 0.0f;
        stage_regs ra, rb;
        int        ks = 0;
        for (; ks + 1 < nks; ks += 2) {
            step(it + ks, ks, ra, rb);
            step(it + ks + 1, ks + 1, rb, ra);
        }
        if (ks < nks) step(it + ks, ks, ra, rb);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        fence_acc();
        it += nks;
        if (PERSIST) mbar_arrive(bar_empty + 8 * ((it - 1) % STAGES)); /* the tile's last stage */

        if (wg_staged<WARPS, MT, NT, PERSIST ? EPI_B : STAGES * STAGE_B>(p)) { /* BF16 output through smem */
            /* Each consumer warpgroup writes its own bands and stores its own output
             * columns, with a barrier of its own (2 + warpgroup): the warpgroups do not
             * wait for each other, so one's epilogue can run under the other's next MMAs
             * (persistent kernel). Before the writes: persistent, the output buffer is
             * the CTA's own and the warpgroup's barrier orders this tile's writes after
             * its reads of the last tile's (the same bytes: its own columns); per-tile
             * kernel, the stage buffers, so every consumer first (barrier 1, all of
             * them): the producer warpgroup has left or is leaving (its nks stage loads
             * were all waited for on their `full` mbarriers, by every consumer thread,
             * so none of its copies is still writing), and after it every consumer's
             * MMAs (wait_group 0) and decode reads are done. */
            const int wgi = cw >> 2;
            int       c0, cn;
            wg_columns(p, MT, wgi, c0, cn);
            if (PERSIST) wg_bar_sync_id(2 + wgi, 128);
            else wg_bar_sync<WARPS * 32>();
            wg_epilogue_staged<OSS, WARPS, MT, NT, 128>(p, o, smem + (PERSIST ? STAGES * STAGE_B : 0), tl.fb, cw, bvalid, tl.row0,
                                                   tl.rows, tl.e, osc, g, t, threadIdx.x - 128 * (1 + wgi), c0, cn, acc,
                                                   [wgi] { wg_bar_sync_id(2 + wgi, 128); });
        } else {
            epilogue<OSS, MT, NT>(p, o, band, bvalid, tl.row0, tl.rows, tl.e, osc, g, t,
                                  [&](int i, int n, int q) { return acc[i][n * 4 + q]; });
        }
        if (!PERSIST || slot > 0x7FFFFFFF - slot_step) break;
        slot += slot_step;
        if (!tile_at(slot, tl)) break;
    }
#else
    (void)p;
    (void)nfb;
    (void)o;
#endif
}

template <int WARPS, int MT, int NT, int KC, int STAGES, bool PERSIST>
__global__ void __launch_bounds__((WARPS + FM_WGMMA_PRODUCER_WARPS) * 32, 1) wgmma_ws_kernel(const fm_gemm_params p, int nfb)
{
    wgmma_ws_body<WARPS, MT, NT, KC, STAGES, PERSIST, false>(p, nfb, fm_gemm_oss{});
}

/* the same with gpt-oss's epilogues (p.bias, p.act) */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool PERSIST>
__global__ void __launch_bounds__((WARPS + FM_WGMMA_PRODUCER_WARPS) * 32, 1)
    wgmma_oss_ws_kernel(const fm_gemm_params p, int nfb, const fm_gemm_oss o)
{
    wgmma_ws_body<WARPS, MT, NT, KC, STAGES, PERSIST, true>(p, nfb, o);
}
