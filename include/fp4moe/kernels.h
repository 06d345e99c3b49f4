/* fp4moe/kernels.h - fp4moe's own GEMM kernels as the runtime knows them: the tile
 * type (one row of the compiled catalogue), the kernel families and variants, the
 * weights' element type, and the ranking the launcher takes its tile from
 * (fm_plan_fp4moe). Part of the runtime (fp4moe.h); the CUTLASS shared-memory audit
 * that also speaks of families and elements is fp4moe/plan.h, a tool
 * (fp4moe/tools.h).
 */
#ifndef FP4MOE_KERNELS_H
#define FP4MOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/arch.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FM_FAMILY_AUTO = 0,        /* pick from the architecture */
    FM_FAMILY_CUTLASS_SM90,    /* TMA warp-specialized GEMM, ptr-array grouped, BF16/FP8 */
    FM_FAMILY_CUTLASS_SM120,   /* block-scaled grouped GEMM (NVFP4, MXFP4, FP8xFP4) */
    FM_FAMILY_CUTLASS_SM100,   /* block-scaled UMMA grouped GEMM, 1-SM and 2-SM (NVFP4, MXFP4) */
    FM_FAMILY_FP4MOE_MMA,      /* fp4moe's own small-M swap-AB FP4 grouped GEMM (src/cuda/gemm_mma.cuh) */
    FM_FAMILY_FP4MOE_WGMMA,    /* the same swap-AB GEMM on warpgroup MMAs, sm_90a only (src/cuda/gemm_wgmma.cu) */
    FM_FAMILY_COUNT
} fm_kernel_family;

/* The mma family's former name, for code written against it (its kernels swap A and B so that
 * a few tokens are the mma's N dimension); fm_family_parse and fm_tile_parse also read the old
 * spellings ("fp4moe-swapab", "swapab_w4m2n1k256s3") in plan files written before. */
#define FM_FAMILY_FP4MOE_SWAPAB FM_FAMILY_FP4MOE_MMA

/* A GEMM operand's element type, for the byte model: what a CUTLASS kernel's A, B, C
 * and D hold (void, FP16, FP32 and FP8 among them). Not fm_format (fp4moe/format.h),
 * the format fp4moe stores weights in (BF16, NVFP4, MXFP4: what the quantizer, the
 * loaders and the backends take); the two share NVFP4/MXFP4, and the GPU path maps one
 * to the other in one table (src/cuda/prepack.c, k_pack_formats). */
typedef enum {
    FM_ELEM_VOID = 0, /* no C (no source) / no D (the epilogue stores itself) */
    FM_ELEM_BF16,
    FM_ELEM_FP16,
    FM_ELEM_FP32,
    FM_ELEM_FP8, /* E4M3 (MX FP8 on block-scaled archs) */
    FM_ELEM_NVFP4,
    FM_ELEM_MXFP4,
    FM_ELEM_COUNT
} fm_elem;

/* "void", "bf16", "fp16", "fp32", "fp8", "nvfp4", "mxfp4"; "?" otherwise. */
const char *fm_elem_name(fm_elem e);

/* ---- fp4moe's own kernels: the ranking the launcher takes its tile from ----
 *
 * fm_plan_fp4moe ranks every compiled tile of fp4moe's kernels for one grouped
 * GEMM by a cost model of the kernels (src/kernels/cost_fp4moe.c: occupancy from the
 * shared-memory model, per-stage bytes / instruction issue / tensor work, waves,
 * pipeline fill and output bytes, times a per-tile efficiency), whose parameters
 * are fitted to every tile's timing on the H200 (bench/fit_tile_model.py, from
 * bench/h200_fp4moe_tiles.csv). On another GPU the same parameters are scaled by
 * its bandwidth and BF16 rate per SM from the GPU table: a prediction, not a
 * measurement. fm_cuda_gemm launches the first candidate when it is given no tile. */
/* ---- fp4moe's own tiles ----
 * One compiled tile of fp4moe's kernels (src/kernels/fm_tiles.def is the catalogue):
 * the CTA covers warps*mt*16 output features and 8*nt tokens (an expert's rows) a
 * pass, kc of K a pipeline stage, `stages` deep.
 *   warps    warps per CTA (wgmma: consumer warps, 4/8/12)
 *   mt       16-row weight bands per warp (wgmma: m64 tiles per warpgroup)
 *   nt       8-token groups a pass (wgmma N = 8*nt)
 *   kc       K per stage, a multiple of 64
 *   stages   pipeline depth
 *   persist  wgmma: 1 = the persistent kernel; 0 otherwise
 *   family   FM_FAMILY_FP4MOE_MMA or FM_FAMILY_FP4MOE_WGMMA; FM_FAMILY_AUTO (0) = not
 *            said (a tile written by its first five or six fields): fm_tile_equal then
 *            matches either family, fm_cuda_gemm (fp4moe/cuda.h) launches it as mma.sync
 * The one tile type of the library: the planner's catalogue and candidates
 * (fm_fp4moe_choice.tile), fm_cuda_gemm's argument, the CLI and the bench.
 * Names: "mma_w4m1n1k256s4" (mma.sync), "wgmma_w8m2n16k64s8", persistent
 * "wgmma_w8m1n32k64s4p". */
typedef struct {
    int              warps, mt, nt, kc, stages;
    int              persist;
    fm_kernel_family family;
} fm_tile;

/* The tile's name into buf (NUL-terminated, truncated to n; "(null)" for t NULL; no
 * family prefix for FM_FAMILY_AUTO). Returns buf. */
char *fm_tile_name(const fm_tile *t, char *buf, size_t n);
/* Parse a name as fm_tile_name writes it (family prefix required). Returns FM_OK,
 * FM_ERR_INVALID_ARG (NULL), FM_ERR_NOT_FOUND (not of that form: the detail shows it);
 * whether the tile is compiled in is fm_plan_check's question. *out written only on FM_OK. */
fm_status fm_tile_parse(const char *s, fm_tile *out);
/* 1 if a and b are the same tile: the six fields, and the family where both say one. */
int fm_tile_equal(const fm_tile *a, const fm_tile *b);

/* The kernel that runs an fp4moe tile: the compiled kernels of the two families
 * (gemm_mma.cuh, gemm_wgmma.cu), as the planner's occupancy model, its register
 * table and its fitted efficiencies know them. */
typedef enum {
    FM_VARIANT_MMA = 0,          /* mma.sync, one feature block per CTA */
    FM_VARIANT_MMA_MULTI_BLOCK,  /* mma.sync, feature_blocks > 1 (rows with mb = 1) */
    FM_VARIANT_WGMMA_NATURAL_X,  /* wgmma single-role kernel: X in natural column order */
    FM_VARIANT_WGMMA_PACKED_X,   /* wgmma warp-specialized kernel: packed X, + a producer warpgroup */
    FM_VARIANT_WGMMA_PERSISTENT, /* its persistent form (rows with persist = 1; packed X only) */
    FM_VARIANT_COUNT
} fm_kernel_variant;
/* The family a variant belongs to (FM_FAMILY_FP4MOE_MMA or _WGMMA). */
fm_kernel_family fm_variant_family(fm_kernel_variant v);
/* The variant that runs tile t of family fam: mma with feature_blocks > 1 = the
 * multi-block kernel; wgmma: persistent for persist = 1, else packed or natural X. */
fm_kernel_variant fm_variant_of(fm_kernel_family fam, const fm_tile *t, int feature_blocks, int x_packed);
/* "mma", "mma-multi-block", "wgmma-natural-x", "wgmma-packed-x", "wgmma-persistent"; "?" otherwise. */
const char *fm_kernel_variant_name(fm_kernel_variant v);

typedef struct {
    fm_elem weights;        /* FM_ELEM_NVFP4 or FM_ELEM_MXFP4 */
    int     x_packed;       /* 1: X in the prepack K order: only the wgmma kernel reads it */
    int     swiglu;         /* 1: SwiGLU epilogue: tiles with an even mt (gate/up pairs) */
    int     feature_blocks; /* multi-block mma kernels: 0 = rank one block per CTA and the automatic
                               count, 1 = one only, > 1 = that many (tiles that have the kernel) */
    size_t  smem_limit;     /* per-block limit, 0 = the architecture's opt-in limit (min of the two) */
    int     max_k_splits;   /* > 1: also rank the plain mma kernel with K split over 2, 4, ... up to this
                               many CTAs per (expert, feature block), where the unsplit grid leaves SMs
                               idle (few experts with rows: decode on an expert shard); 0/1 = no split */
    /* The catalogue rows that may be chosen (bit r = row r of fm_mma_tiles / fm_wgmma_tiles):
     * an opened device's (fm_cuda_device_code), or both 0 = the rows this build carries for
     * gpu's compute capability (without CUDA: those an equal CUDA build would carry). */
    unsigned long long mma_rows, wgmma_rows;
} fm_fp4moe_query;

typedef struct {
    fm_tile tile;              /* the compiled tile (fm_mma_tiles / fm_wgmma_tiles), its family set:
                                  FM_FAMILY_FP4MOE_MMA (mma.sync) or FM_FAMILY_FP4MOE_WGMMA; persist:
                                  the persistent wgmma kernel (packed X only; one CTA per SM) */
    int    feature_blocks;     /* mma: feature blocks per CTA (1 = the plain kernel); wgmma: 1 */
    fm_kernel_variant variant; /* the kernel that runs it (fm_variant_of) */
    int    k_splits;           /* CTAs sharing the K stages of one (expert, feature block): 1 = none */
    int    ctas_per_sm;        /* the model's CTAs resident per SM */
    size_t smem_bytes;         /* dynamic shared memory per CTA (fm_smem_mma / fm_smem_wgmma) */
    double est_us;             /* the model's time, microseconds */
    double efficiency;         /* the tile's fitted factor in est_us (1 = none measured) */
} fm_fp4moe_choice;

/* Rank the compiled fp4moe tiles that can run q on gpu for experts x [n x k]
 * weights and rows_per_expert rows each (the expected count: the kernels take
 * the real counts from the device), fastest first; tiles over the shared-memory
 * limit, without gate/up pairs for SwiGLU, or without the requested multi-block
 * kernel are left out, and wgmma tiles where the architecture has no wgmma or K % 64
 * != 0 with packed X. Writes at most cap entries, *count = written, *total (if
 * not NULL) = all that qualified. Statuses: FM_OK, FM_ERR_INVALID_ARG (NULL,
 * weights not nvfp4/mxfp4, feature_blocks < 0), FM_ERR_BAD_SHAPE (rows, n, k or
 * experts < 1 or > INT32_MAX, n % 16, k % 16 for nvfp4 / % 32 for mxfp4),
 * FM_ERR_NOT_FOUND (unknown architecture), FM_ERR_ARCH_MISMATCH (no fp4moe kernel
 * on the architecture, or packed X without wgmma), FM_ERR_SMEM_EXCEEDED (every
 * tile is over the shared-memory limit), FM_ERR_UNSUPPORTED (no tile qualifies
 * for another reason, or packed X with K % 64 != 0: the detail says why). Outputs are
 * written only on FM_OK. */
fm_status fm_plan_fp4moe(const fm_gpu_info *gpu, const fm_fp4moe_query *q, int64_t rows_per_expert, int64_t n,
                         int64_t k, int64_t experts, fm_fp4moe_choice *out, size_t cap, size_t *count, size_t *total);
/* The automatic feature-block count of fm_cuda_gemm for a tile that has the
 * multi-block kernel: K <= 512 and enough blocks that experts x blocks / nb keeps
 * about 16 CTAs per SM (at most 8); 1 otherwise. */
int fm_plan_fp4moe_auto_blocks(int warps, int mt, int swiglu, int64_t n, int64_t k, int64_t experts, int sms);

#ifdef __cplusplus
}
#endif
#endif
