/* fp4moe/plan.h - the shared-memory planner: exact bytes of a GPU GEMM tile, a
 * truthful can-it-run check, and ranked candidates.
 *
 * The model reproduces sizeof(GemmKernel::SharedStorage) of CUTLASS's grouped
 * (ptr-array) kernels member by member - including the alignas(1024) padding,
 * tensor maps and scheduler storage that CUTLASS's automatic stage count leaves
 * out - and the stage count each CollectiveBuilder picks.  See docs/planner.md.
 *
 * What FM_OK + result.fits == 1 guarantees: the kernel's static shared storage
 * (what GemmUniversalAdapter::initialize() passes to cudaFuncSetAttribute) is at
 * most the architecture's opt-in per-block limit, so initialize() will not fail
 * for shared memory. It says nothing about registers, occupancy or speed.
 */
#ifndef FP4MOE_PLAN_H
#define FP4MOE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/arch.h"
#include "fp4moe/smem.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FM_FAMILY_AUTO = 0,        /* pick from the architecture */
    FM_FAMILY_CUTLASS_SM90,    /* TMA warp-specialized GEMM, ptr-array grouped, BF16/FP8 */
    FM_FAMILY_CUTLASS_SM120,   /* block-scaled grouped GEMM (NVFP4, MXFP4, FP8xFP4) */
    FM_FAMILY_CUTLASS_SM100,   /* block-scaled UMMA grouped GEMM, 1-SM and 2-SM (NVFP4, MXFP4) */
    FM_FAMILY_FP4MOE_SWAPAB,   /* fp4moe's own small-M swap-AB FP4 grouped GEMM (src/cuda/gemm_mma.cuh) */
    FM_FAMILY_FP4MOE_WGMMA,    /* the same swap-AB GEMM on warpgroup MMAs, sm_90a only (src/cuda/gemm_wgmma.cu) */
    FM_FAMILY_COUNT
} fm_kernel_family;

/* A set of families for fm_plan_candidates_in: FM_FAMILY_BIT(f) | ...; 0 = all. */
#define FM_FAMILY_BIT(f) (1u << (unsigned)(f))
#define FM_FAMILIES_CUTLASS                                                                       \
    (FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM90) | FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM120) |             \
     FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM100))

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

typedef enum { FM_SCHED_AUTO = 0, FM_SCHED_COOP, FM_SCHED_PINGPONG, FM_SCHED_1SM, FM_SCHED_2SM, FM_SCHED_COUNT } fm_schedule;

/* The epilogue's shared-memory kind, for the planner's byte model: how CUTLASS's
 * epilogue collective stores D (it changes the SharedStorage). Not the same concept as
 * fm_cuda_epilogue (fp4moe/cuda.h), the operation fp4moe's own kernels apply to the
 * output (plain, SwiGLU, router-weighted scatter-add): those kernels' bytes do not
 * depend on it (their output leaves from registers or the drained stages), and a
 * CUTLASS FINALIZE here is TensorRT-LLM's fused scatter, which fp4moe runs as
 * FM_CUDA_EPI_FINALIZE(_DET). Two enums, two questions. */
typedef enum {
    FM_EPI_TMA = 0,  /* CUTLASS TMA warp-specialized epilogue (TensorRT-LLM "default": C smem reused for D) */
    FM_EPI_NOSMEM,   /* no shared memory: registers straight to global */
    FM_EPI_FINALIZE, /* TensorRT-LLM FINALIZE: router-scale + scatter-add in the TMA epilogue, D = void */
    FM_EPI_COUNT
} fm_epilogue;

/* One kernel configuration: everything that changes the bytes.
 * For FM_FAMILY_FP4MOE_SWAPAB the tile reads: tile_m = tokens per pass (8*nt),
 * tile_n = output features per CTA (warps*mt*16), tile_k = K per stage (kc),
 * `warps` warps per CTA (0 = 4); the CUTLASS-only fields (c, d, schedule, cluster,
 * cutlass) do not change its bytes: its epilogue (plain store, SwiGLU or FINALIZE)
 * goes from registers to global memory.
 * FM_FAMILY_FP4MOE_WGMMA reads the tile the same way (tile_m = 8*nt tokens a pass,
 * 8..256; tile_n = warps*mt*16 with mt 1 or 2; tile_k = kc, 64..256), `warps` 4 or 8
 * (one or two warpgroups; 0 = 8); it exists only where the architecture has
 * FM_FEAT_WGMMA (sm_90), anywhere else FM_ERR_ARCH_MISMATCH. */
typedef struct {
    int              cc;          /* target architecture (90, 120, ...) */
    fm_kernel_family family;      /* FM_FAMILY_AUTO picks from cc */
    fm_elem          a, b;        /* operand element types */
    fm_elem          c, d;        /* epilogue source / destination */
    int              tile_m, tile_n, tile_k;
    int              cluster_m, cluster_n; /* 0 = 1 */
    fm_schedule      schedule;
    fm_epilogue      epilogue;
    int              stages;      /* 0 = automatic (StageCountAutoCarveout of the epilogue) */
    int              swap_ab;     /* TensorRT-LLM swap-AB variant (only FINALIZE bytes depend on it) */
    int              cutlass;     /* CUTLASS version: major * 100 + minor * 10 + patch (4.7.0 = 470); 0 = 420.
                                     The bytes follow the version: 4.2, 4.4, 4.5, 4.7 are checked against
                                     measured CUTLASS trees (tests/conformance/truth-*.csv), exact */
    int              warps;       /* fp4moe kernels: warps per CTA (0 = the family's default: swapab 4, wgmma 8) */
    int              persistent;  /* fp4moe-wgmma: the persistent kernel (one CTA per SM over the tiles, its
                                     own output buffer in shared memory); 0 elsewhere */
    int              plain;       /* CUTLASS families: 1 = one GEMM (the non-ptr-array kernel: no tensor maps
                                     in shared memory, the persistent tile scheduler), 0 = grouped (ptr-array,
                                     what MoE engines run) */
    int              epi_tile_m, epi_tile_n; /* CUTLASS families: an explicit epilogue tile (the epilogue
                                     CollectiveBuilder's EpilogueTileType = Shape<_M,_N>, as SGLang's and vLLM's
                                     SM100 FP4 kernels pass 128x64); 0x0 = EpilogueTileAuto (the builder's own).
                                     The builders take it as given, so it sets the epilogue's sub-tile count, its
                                     C/D stages and through them the mainloop's automatic stage count; each
                                     builder's static_asserts on it are checked (docs/planner.md) */
} fm_kernel_config;

/* The newest CUTLASS version measured (tests/conformance/truth-*.csv): `fp4moe explain`'s default. */
#define FM_CUTLASS_NEWEST 470

/* Fill a config with the defaults: BF16 C/D, TMA epilogue, auto stages, CUTLASS 4.2.
 * For FM_FAMILY_FP4MOE_SWAPAB and _WGMMA, stages = 0 means "the stage count of the
 * first compiled instantiation of that tile shape" (fm_swapab_tiles / fm_wgmma_tiles
 * order). */
void fm_kernel_config_init(fm_kernel_config *cfg);

/* Shared-memory model: the breakdown and total of one configuration on the
 * architecture `cc` (validated).  `stages` in the breakdown is the stage count
 * the kernel gets (cfg->stages or the builder's automatic choice).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_NOT_FOUND (unknown cc),
 * FM_ERR_BAD_SHAPE (malformed tile/cluster/stages), FM_ERR_ARCH_MISMATCH (format or
 * family not available on that arch), FM_ERR_UNSUPPORTED (combination not modelled). */
fm_status fm_smem_model(const fm_kernel_config *cfg, fm_smem_breakdown *out);

/* Verdict of fm_plan_check. */
typedef struct {
    int                fits;           /* 1: total <= limit_bytes */
    fm_smem_breakdown  bytes;          /* the real struct, broken down */
    size_t             limit_bytes;    /* opt-in per-block limit of the arch */
    int                auto_stages;    /* what the builder's arithmetic picks (0 if it finds none) */
    size_t             builder_bytes;  /* what that arithmetic believes the kernel needs */
    int                builder_fits;   /* 1: builder_bytes <= capacity (what can_implement implies) */
    int                best_stages;    /* most stages that really fit (0: none do) */
    size_t             best_bytes;     /* total with best_stages */
    int64_t            tiles;          /* CTA tiles of the problem (0 if no problem was given) */
    double             waves;          /* tiles / SMs (0 if unknown) */
    char               reason[320];    /* one line: why it fits or not, and the fix */
} fm_plan_result;

/* The truthful check.  Return value: whether the query itself worked.
 * `problem_*` may be 0 (unknown); sms = 0 skips waves.  k must be a multiple of
 * tile_k when given.  Statuses as fm_smem_model plus FM_ERR_BAD_SHAPE for a K
 * that is not a multiple of tile_k, and FM_ERR_UNSUPPORTED for an fp4moe tile that
 * is not compiled into the library (fm_swapab_tiles / fm_wgmma_tiles list them): for
 * fp4moe's own kernels the check answers exactly what the launcher will do, because
 * both call fm_smem_swapab / fm_smem_wgmma.  Tiles: swap-AB runs one CTA per
 * (expert, N block) looping over passes, wgmma one CTA per (expert, pass, N block).  FM_ERR_BAD_SHAPE also for rows_per_expert, n, k or experts negative
 * or above INT32_MAX (CUTLASS problem shapes are int), or a problem of more than
 * 2^62 CTA tiles.  *out is written only on FM_OK. */
fm_status fm_plan_check(const fm_kernel_config *cfg, int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts,
                        int sms, fm_plan_result *out);

/* One candidate of fm_plan_candidates. */
typedef struct {
    fm_kernel_config cfg;
    fm_plan_result   res;
    double           wasted_rows;   /* fraction of tile rows with no token (rows_per_expert vs tile_m) */
    double           bytes_per_flop;/* operand bytes loaded per useful FLOP */
    double           est_us;        /* estimated time: max(memory, compute) / efficiency (an estimate) */
} fm_plan_candidate;

/* Ranked candidates for (a/b format, epilogue, shape) on a GPU, from the kernel families
 * in `families` (FM_FAMILY_BIT set; 0 = all: the CUTLASS tiles of the GPU's architecture
 * and, for FP4 weights, fp4moe's compiled swap-AB tiles and, where the architecture has
 * FM_FEAT_WGMMA (sm_90), its compiled wgmma tiles; FM_FAMILIES_CUTLASS = CUTLASS
 * only), each checked: fitting ones first by est_us (two estimates within 2% of their
 * group's best are a tie, broken by less wasted rows, then fewer shared-memory bytes),
 * then the rejected ones.  Writes at most `cap` entries into out, the number written
 * into *count (total considered in *total if not NULL).  Statuses: FM_OK,
 * FM_ERR_INVALID_ARG, FM_ERR_ARCH_MISMATCH (no tile of the set takes that format on that
 * arch, e.g. FP4 on sm_90's CUTLASS, or a set of only fp4moe-wgmma off sm_90), FM_ERR_BAD_SHAPE (n/k/rows/experts <= 0 or
 * > INT32_MAX, or a K that is a multiple of no tile K of the set: the detail lists the
 * tile Ks), FM_ERR_INVALID_ARG also when ab is void or fp32 (not a GEMM operand),
 * FM_ERR_UNSUPPORTED (no family of the set modelled for that GPU and format).
 * *count, *total and out are written only on FM_OK. */
fm_status fm_plan_candidates_in(unsigned families, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab,
                                int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts, fm_plan_candidate *out,
                                size_t cap, size_t *count, size_t *total);
/* fm_plan_candidates_in with the CUTLASS rows modelled for CUTLASS version `cutlass`
 * (fm_kernel_config.cutlass: major*100 + minor*10 + patch, 0 = 4.2, as
 * fm_plan_candidates_in does); fp4moe's own rows do not depend on it. Same statuses,
 * plus fm_kernel_config_check's FM_ERR_UNSUPPORTED for a version it does not model
 * (reported per row as rejected). */
fm_status fm_plan_candidates_ver(unsigned families, int cutlass, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi,
                                 int swap_ab, int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts,
                                 fm_plan_candidate *out, size_t cap, size_t *count, size_t *total);
/* fm_plan_candidates_in(FM_FAMILIES_CUTLASS, ...): the CUTLASS catalogue of the GPU's
 * architecture only (what this function has always answered).  Same statuses. */
fm_status fm_plan_candidates(const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab, int64_t rows_per_expert,
                             int64_t n, int64_t k, int64_t experts, fm_plan_candidate *out, size_t cap, size_t *count,
                             size_t *total);
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
 *   family   FM_FAMILY_FP4MOE_SWAPAB or FM_FAMILY_FP4MOE_WGMMA; FM_FAMILY_AUTO (0) = not
 *            said (a tile written by its first five or six fields): fm_tile_equal then
 *            matches either family, fm_cuda_gemm (fp4moe/cuda.h) launches it as mma.sync
 * The one tile type of the library: the planner's catalogue and candidates
 * (fm_fp4moe_choice.tile), fm_cuda_gemm's argument, the CLI and the bench.
 * Names: "swapab_w4m1n1k256s4" (mma.sync), "wgmma_w8m2n16k64s8", persistent
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
/* The family a variant belongs to (FM_FAMILY_FP4MOE_SWAPAB or _WGMMA). */
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
    /* The catalogue rows that may be chosen (bit r = row r of fm_swapab_tiles / fm_wgmma_tiles):
     * an opened device's (fm_cuda_device_code), or both 0 = the rows this build carries for
     * gpu's compute capability (without CUDA: those an equal CUDA build would carry). */
    unsigned long long mma_rows, wgmma_rows;
} fm_fp4moe_query;

typedef struct {
    fm_tile tile;              /* the compiled tile (fm_swapab_tiles / fm_wgmma_tiles), its family set:
                                  FM_FAMILY_FP4MOE_SWAPAB (mma.sync) or FM_FAMILY_FP4MOE_WGMMA; persist:
                                  the persistent wgmma kernel (packed X only; one CTA per SM) */
    int    feature_blocks;     /* mma: feature blocks per CTA (1 = the plain kernel); wgmma: 1 */
    fm_kernel_variant variant; /* the kernel that runs it (fm_variant_of) */
    int    k_splits;           /* CTAs sharing the K stages of one (expert, feature block): 1 = none */
    int    ctas_per_sm;        /* the model's CTAs resident per SM */
    size_t smem_bytes;         /* dynamic shared memory per CTA (fm_smem_swapab / fm_smem_wgmma) */
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

/* Names and parsers ("nvfp4", "coop", "finalize", "128x256x128", "4.2").
 * Parsers return FM_OK, FM_ERR_INVALID_ARG (NULL) or FM_ERR_BAD_SHAPE / FM_ERR_FORMAT /
 * FM_ERR_NOT_FOUND with a detail naming the accepted values. */
const char *fm_elem_name(fm_elem e);
const char *fm_schedule_name(fm_schedule s);
const char *fm_epilogue_name(fm_epilogue e);
const char *fm_family_name(fm_kernel_family f);
fm_status   fm_family_parse(const char *s, fm_kernel_family *out); /* FM_ERR_NOT_FOUND lists the names */
fm_status   fm_elem_parse(const char *s, fm_elem *out);
fm_status   fm_schedule_parse(const char *s, fm_schedule *out);
fm_status   fm_epilogue_parse(const char *s, fm_epilogue *out);
/* A CUTLASS tile shape "MxNxK" (fm_tile_parse is fp4moe's tile names). */
fm_status   fm_tile_shape_parse(const char *s, int *m, int *n, int *k);
/* An epilogue tile "MxN" (M, N in [1, 256], digits only) or "auto" (0x0), for
 * fm_kernel_config.epi_tile_m / epi_tile_n; anything else is FM_ERR_BAD_SHAPE. */
fm_status   fm_epi_tile_parse(const char *s, int *m, int *n);
/* Accepts exactly "4.M" or "4.M.P" (digits, nothing after); anything else is FM_ERR_NOT_FOUND. */
fm_status   fm_cutlass_version_parse(const char *s, int *out);

#ifdef __cplusplus
}
#endif
#endif
