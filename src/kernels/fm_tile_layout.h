/* fm_tile_layout.h - the shared-memory layout of one pipeline stage of fp4moe's
 * kernels, written once: the planner's model (fm_kernels_smem.c), the kernels'
 * offsets (gemm_mma.cuh, wgmma_natural.cuh, wgmma_ws.cuh), the launch-bounds
 * hint and the cost model's occupancy (cost_fp4moe.c) all expand these macros.
 * Macros, not functions: C11's _Static_assert and C++'s constexpr both take them,
 * so every row of the tile catalogue (fm_tiles.def) is checked at compile time in
 * C (fm_kernels_smem.c) and in CUDA (the .cu files), with or without a GPU.
 * int arithmetic: every compiled tile stays far below 2^31 bytes.
 *
 * Tile fields (fm_kernels_smem.h): w warps (consumer warps for wgmma), mt 16-row
 * bands per warp, nt 8-token groups a pass, kc K per stage, st stages.
 *
 * Family mma (mma.sync, gemm_mma.cuh), one stage, offsets from its start:
 *   [0, W_OFF)          the token tile X[8*nt][kc] BF16, each row + 16 B padding
 *                        (conflict-free 16-byte fragment reads)
 *   [W_OFF, S_OFF)      the FP4 weight chunks: w*mt*(kc/64) of 512 B (16 rows x 64 K)
 *   [S_OFF, STAGE)      their scale bytes: 64 B per chunk
 * Family wgmma (gemm_wgmma.cu), one stage:
 *   [0, W_OFF)          the token tile, 128-byte-swizzled K-major lines, no padding
 *   [W_OFF, S_OFF)      weight chunks, [S_OFF, RAW) scale bytes, as above
 *   [RAW, STAGE)        up to the next 1 KB: every stage starts on a swizzle atom
 * after the stages: the persistent kernel's output tile (EPI), then a full and an
 * empty mbarrier per stage (16 B each stage). */
#ifndef FM_TILE_LAYOUT_H
#define FM_TILE_LAYOUT_H

#define FM_TILE_CHUNK_K 64       /* K of one prepacked weight chunk: 4 mma k16 steps */
#define FM_TILE_CHUNK_BYTES 512  /* 16 rows x 64 K of E2M1 = 32 lanes x 16 B */
#define FM_TILE_CHUNK_SF_BYTES 64 /* their scale bytes: 16 rows x 4 blocks (32 lanes x 2 B) */
#define FM_MMA_ROW_PAD 16     /* bytes of padding per staged X row: breaks the 8-way bank conflict */
#define FM_WGMMA_STAGE_ALIGN 1024 /* a 128-byte-swizzle atom: 8 rows x 128 B */
#define FM_WGMMA_BAR_BYTES 16    /* per stage: its full and empty mbarriers */

/* 64-K weight chunks of one stage */
#define FM_TILE_CHUNKS(w, mt, kc) ((w) * (mt) * ((kc) / FM_TILE_CHUNK_K))

/* ---- mma ---- */
#define FM_MMA_ROW_BYTES(kc) (2 * (kc) + FM_MMA_ROW_PAD) /* one staged X row */
#define FM_MMA_W_OFF(nt, kc) (8 * (nt) * FM_MMA_ROW_BYTES(kc))
#define FM_MMA_S_OFF(w, mt, nt, kc) (FM_MMA_W_OFF(nt, kc) + FM_TILE_CHUNKS(w, mt, kc) * FM_TILE_CHUNK_BYTES)
#define FM_MMA_STAGE_BYTES(w, mt, nt, kc) \
    (FM_MMA_S_OFF(w, mt, nt, kc) + FM_TILE_CHUNKS(w, mt, kc) * FM_TILE_CHUNK_SF_BYTES)
/* dynamic shared memory of a mma tile (no static smem, no mbarriers) */
#define FM_MMA_SMEM(w, mt, nt, kc, st) ((st) * FM_MMA_STAGE_BYTES(w, mt, nt, kc))

/* ---- wgmma ---- */
#define FM_WGMMA_W_OFF(nt, kc) (8 * (nt) * (kc) * 2)
#define FM_WGMMA_S_OFF(w, mt, nt, kc) (FM_WGMMA_W_OFF(nt, kc) + FM_TILE_CHUNKS(w, mt, kc) * FM_TILE_CHUNK_BYTES)
#define FM_WGMMA_STAGE_RAW(w, mt, nt, kc) \
    (FM_WGMMA_S_OFF(w, mt, nt, kc) + FM_TILE_CHUNKS(w, mt, kc) * FM_TILE_CHUNK_SF_BYTES)
#define FM_WGMMA_STAGE_BYTES(w, mt, nt, kc) \
    ((FM_WGMMA_STAGE_RAW(w, mt, nt, kc) + FM_WGMMA_STAGE_ALIGN - 1) / FM_WGMMA_STAGE_ALIGN * FM_WGMMA_STAGE_ALIGN)
/* the persistent kernel's own output tile: 8*nt token rows of w*mt*16 BF16 features + 16 B
 * (kernel_common.cuh staged_tile_bytes) */
#define FM_WGMMA_EPI_BYTES(w, mt, nt) (8 * (nt) * (2 * (w) * (mt) * 16 + 16))
/* dynamic shared memory of a wgmma tile (persist 0/1); the natural-X kernel is launched
 * with the same size (it leaves the mbarrier bytes unused) */
#define FM_WGMMA_SMEM(w, mt, nt, kc, st, persist)                                           \
    ((st) * (FM_WGMMA_STAGE_BYTES(w, mt, nt, kc) + FM_WGMMA_BAR_BYTES) +                      \
     ((persist) ? FM_WGMMA_EPI_BYTES(w, mt, nt) : 0))

/* The packed-X and persistent wgmma kernels' producer warpgroup: warps a CTA has on top
 * of its `warps` consumer warps (fm_kernel_threads; the kernels' __launch_bounds__). */
#define FM_WGMMA_PRODUCER_WARPS 4

/* ---- occupancy terms (Hopper) ---- */
#define FM_SMEM_RESERVED_PER_BLOCK 1024 /* the driver's shared memory per resident block */
#define FM_SMEM_OPTIN_MAX 232448        /* sm_90 / sm_100 opt-in per block (227 KB): no tile may exceed it */
#define FM_HINT_SMEM_PER_SM (225 * 1024) /* the launch-bounds hint's usable shared memory per SM (~225 KB) */
#define FM_REGS_PER_SM 65536
#define FM_HINT_MIN_REGS 64 /* the hint keeps >= 64 registers per thread */

/* The mma kernel's __launch_bounds__ minimum blocks per SM, for the small-batch
 * tiles (nt <= 2): the CTAs the tile's shared memory allows on Hopper, at most 8 and
 * at most what leaves 64 registers per thread; 1 for nt > 2 (MMA-heavier tiles keep
 * their accumulators in registers). A register-allocation hint only (the launch is
 * sized by fm_smem_mma). Measured: without it the small tiles took 143 registers
 * and ran 3 CTAs (12 warps) per SM, stalled on the dequant dependency chain. */
#define FM_MMA_HINT_SMEM_BLOCKS(w, mt, nt, kc, st) \
    (FM_HINT_SMEM_PER_SM / (FM_MMA_SMEM(w, mt, nt, kc, st) + FM_SMEM_RESERVED_PER_BLOCK))
#define FM_MMA_HINT_REG_BLOCKS(w) (FM_REGS_PER_SM / ((w) * 32 * FM_HINT_MIN_REGS))
#define FM_MIN_(a, b) ((a) < (b) ? (a) : (b))
#define FM_CLAMP_(v, lo, hi) ((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v))
#define FM_MMA_MIN_BLOCKS(w, mt, nt, kc, st)                                                              \
    FM_CLAMP_(FM_MIN_((nt) > 2 ? 1 : FM_MMA_HINT_SMEM_BLOCKS(w, mt, nt, kc, st), FM_MMA_HINT_REG_BLOCKS(w)), \
              1, 8)

/* ---- the W4A8 GEMM's staged kernels (gemm_fp8.cu, FM_FP8MMA_STAGED*) ----
 * One stage = one 128-K group, offsets from its start:
 *   [0, W_OFF)          the rows' tile X[8*nt][128] E4M3, each row + 16 B (conflict-free B reads)
 *   [W_OFF, S_OFF)      the packed codes: w*mt bands x 2 chunks of 512 B
 *   [S_OFF, STAGE)      the bands' group scales: 16 rows x 4 UE8M0 (64 B) or 8 E4M3 (128 B) codes
 * nv: NVFP4 (1) or MXFP4 (0). fm_fp8mma_smem_bytes (prepack_fp8.c) and the kernel's constexpr
 * layout both expand these. */
#define FM_FP8S_KC 128
#define FM_FP8S_ROW_BYTES (FM_FP8S_KC + 16)
#define FM_FP8S_SF_BYTES(nv) ((nv) ? 128 : 64)
#define FM_FP8S_W_OFF(nt) (8 * (nt) * FM_FP8S_ROW_BYTES)
#define FM_FP8S_S_OFF(w, mt, nt) (FM_FP8S_W_OFF(nt) + (w) * (mt) * (FM_FP8S_KC / FM_TILE_CHUNK_K) * FM_TILE_CHUNK_BYTES)
#define FM_FP8S_STAGE_BYTES(w, mt, nt, nv) (FM_FP8S_S_OFF(w, mt, nt) + (w) * (mt) * FM_FP8S_SF_BYTES(nv))
#define FM_FP8S_SMEM(w, mt, nt, st, nv) ((st) * FM_FP8S_STAGE_BYTES(w, mt, nt, nv))
#define FM_FP8S_WARPS 4 /* a CTA: 4 warps x 2 bands of 16 features */
#define FM_FP8S_BANDS 2
/* The staged kernels built, X(tokens a pass, nt, stages): FM_FP8MMA_STAGED<tokens> (gemm_fp8.h)
 * is the one with nt 8-token groups a pass; the launcher, fm_fp8mma_smem_bytes and
 * `fp4moe explain --w4a8` all expand this list */
#define FM_FP8S_LIST(X) X(16, 2, 4) X(32, 4, 3) X(64, 8, 3)

/* ---- the W4A8 GEMM's wgmma kernels (gemm_fp8.cu, FM_FP8MMA_WG*: sm_90a, MXFP4) ----
 * One warpgroup a CTA, mt m64 tiles of features (warp w: band 4 x tile + w), tok tokens a
 * pass (the wgmma's N). One stage = one 128-K group, offsets from its start (1 KB aligned):
 *   [0, W_OFF)          the rows' tile X[tok][128] E4M3, 128-byte swizzled (1 KB atoms)
 *   [W_OFF, S_OFF)      the packed codes: 4 x mt bands x 2 chunks of 512 B
 *   [S_OFF, ...)        the bands' group scales: 16 rows x 4 UE8M0 codes (64 B) a band
 * a stage rounded up to 1 KB (the next stage's swizzle atoms). fm_fp8mma_smem_bytes
 * (prepack_fp8.c), `fp4moe explain --w4a8` and the kernel's constexpr layout expand these. */
#define FM_FP8W_W_OFF(tok) ((tok) * FM_FP8S_KC)
#define FM_FP8W_S_OFF(mt, tok) (FM_FP8W_W_OFF(tok) + 4 * (mt) * (FM_FP8S_KC / FM_TILE_CHUNK_K) * FM_TILE_CHUNK_BYTES)
#define FM_FP8W_STAGE_BYTES(mt, tok) ((FM_FP8W_S_OFF(mt, tok) + 4 * (mt) * FM_FP8S_SF_BYTES(0) + 1023) / 1024 * 1024)
#define FM_FP8W_SMEM(mt, tok, st) ((st) * FM_FP8W_STAGE_BYTES(mt, tok))
/* The wgmma kernels built, X(tokens a pass, m64 tiles, stages): FM_FP8MMA_WG<tokens> */
#define FM_FP8W_LIST(X) X(32, 2, 4) X(64, 2, 4) X(128, 1, 4)

/* ---- the W4A8 GEMM's warp-specialized wgmma kernels (gemm_fp8.cu, FM_FP8MMA_WS*: sm_90a,
 * MXFP4, opt-in) ----
 * One producer warpgroup (copies, and decodes the codes to E4M3 in shared memory) and cw
 * consumer warpgroups (SS wgmma, one m64 tile of features each), tok tokens a pass. One stage
 * = one 128-K group, offsets from its start (1 KB aligned):
 *   [0, A_OFF)          the rows' tile X[tok][128] E4M3, 128-byte swizzled (as the wg kernels)
 *   [A_OFF, R_OFF)      the decoded weights A[64 cw][128] E4M3, 128-byte swizzled (1 KB atoms)
 *   [R_OFF, S_OFF)      the packed codes: 4 x cw bands x 2 chunks of 512 B
 *   [S_OFF, XS_OFF)     the bands' group scales: 16 rows x 4 UE8M0 codes (64 B) a band
 *   [XS_OFF, F_OFF)     the tokens' activation scales of the group (FP32, tok)
 *   [F_OFF, F_OFF + 16) the group's fold flag (one word)
 * a stage rounded up to 1 KB; after the stages, 2 mbarriers (full, empty) of 8 B a stage.
 * fm_fp8mma_smem_bytes (prepack_fp8.c) and the kernel's constexpr layout expand these. */
#define FM_FP8WS_A_OFF(tok) ((tok) * FM_FP8S_KC)
#define FM_FP8WS_R_OFF(cw, tok) (FM_FP8WS_A_OFF(tok) + 64 * (cw) * FM_FP8S_KC)
#define FM_FP8WS_S_OFF(cw, tok) (FM_FP8WS_R_OFF(cw, tok) + 4 * (cw) * (FM_FP8S_KC / FM_TILE_CHUNK_K) * FM_TILE_CHUNK_BYTES)
#define FM_FP8WS_XS_OFF(cw, tok) (FM_FP8WS_S_OFF(cw, tok) + 4 * (cw) * FM_FP8S_SF_BYTES(0))
#define FM_FP8WS_F_OFF(cw, tok) (FM_FP8WS_XS_OFF(cw, tok) + 4 * (tok))
#define FM_FP8WS_STAGE_BYTES(cw, tok) ((FM_FP8WS_F_OFF(cw, tok) + 16 + 1023) / 1024 * 1024)
#define FM_FP8WS_SMEM(cw, tok, st) ((st) * (FM_FP8WS_STAGE_BYTES(cw, tok) + 16))
/* The warp-specialized kernels built, X(tokens a pass, consumer warpgroups, stages):
 * FM_FP8MMA_WS<tokens> */
#define FM_FP8WS_LIST(X) X(64, 2, 6) X(128, 2, 5)

/* Field ranges each kernel family's template takes (fm_smem_mma / fm_smem_wgmma
 * refuse the rest at run time; fm_tiles.def's rows are checked against them at
 * compile time). */
#define FM_POW2_UPTO_(v, max) ((v) >= 1 && (v) <= (max) && ((v) & ((v) - 1)) == 0)
#define FM_MMA_TILE_OK(w, mt, nt, kc, st)                                                                    \
    ((w) >= 1 && (w) <= 8 && FM_POW2_UPTO_(mt, 4) && FM_POW2_UPTO_(nt, 8) && (kc) >= 64 && (kc) <= 1024 &&        \
     (kc) % 64 == 0 && (st) >= 1 && (st) <= 8)
#define FM_WGMMA_TILE_OK(w, mt, nt, kc, st, persist)                                                             \
    (((w) == 4 || (w) == 8 || (w) == 12) && FM_POW2_UPTO_(mt, 2) && FM_POW2_UPTO_(nt, 32) && (kc) >= 64 &&         \
     (kc) <= 256 && (kc) % 64 == 0 && (st) >= 4 && (st) <= 8 && ((persist) == 0 || (persist) == 1))

#endif
