/* fp4moe/tactics.h - the serving engines' own MoE grouped-GEMM tactic lists, checked
 * on a GPU by the planner.
 *
 * Each engine (TensorRT-LLM, FlashInfer, SGLang, vLLM) compiles a fixed list of CUTLASS
 * grouped-GEMM configurations ("tactics") for its fused MoE and profiles them at start-up.
 * A tactic can pass can_implement() and still fail in initialize() when its
 * SharedStorage is over the per-block opt-in limit (CUTLASS issue #3096): the engine
 * sees kErrorInternal.  The lists are data (src/cutlass/tactics.c), one row per tactic,
 * each naming the source file and commit it was read from; the verdict of every row is
 * fm_plan_check's for the CUTLASS version the row's engine build uses.
 */
#ifndef FP4MOE_TACTICS_H
#define FP4MOE_TACTICS_H

#include <stddef.h>

#include "fp4moe/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What happens to a tactic on the GPU. */
typedef enum {
    FM_TACTIC_FITS = 0,       /* builds and initializes: its SharedStorage fits the opt-in limit */
    FM_TACTIC_DIES_INIT,      /* builds (the builder believed it fits) but initialize() fails:
                                 cudaFuncSetAttribute(MaxDynamicSharedMemorySize) over the limit */
    FM_TACTIC_TOO_BIG,        /* builds, but over the limit with a fixed stage count: initialize() fails */
    FM_TACTIC_COMPILE_REJECT, /* CUTLASS refuses the configuration at compile time */
    FM_TACTIC_VERDICT_COUNT
} fm_tactic_verdict;

/* One tactic as the engine compiles it. */
typedef struct {
    const char      *engine;   /* "trtllm", "flashinfer", "sglang", "vllm" */
    const char      *version;  /* the engine revision the row was read at (a commit) */
    const char      *source;   /* file in the engine's repository */
    const char      *commit;   /* commit of that file */
    const char      *gemm;     /* "fc1" (gate/up, plain epilogue) or "fc2" (down: FINALIZE where fused) */
    int              cc_lo, cc_hi; /* architectures the list is compiled for */
    const char      *format;   /* "nvfp4", "mxfp4" or "fp8xfp4" */
    fm_kernel_config cfg;      /* the kernel: tile in elements, cluster, schedule, epilogue, swap-AB,
                                  stages (0 = StageCountAutoCarveout), CUTLASS version (cfg.cc unset) */
    const char      *note;     /* how the row follows from the source (tile units, expansion) */
} fm_tactic;

/* A tactic checked on a GPU. */
typedef struct {
    const fm_tactic  *tactic;
    fm_tactic_verdict verdict;
    fm_plan_result    res;      /* bytes, stages, limit (zeroed for a compile-time rejection) */
    char              why[320]; /* one line: why it fits, dies or is rejected */
    char              fix[200]; /* what makes it run ("" when it fits) */
} fm_tactic_check;

const char *fm_tactic_verdict_name(fm_tactic_verdict v);

/* The tactics `engine` (at `version`, NULL or "" = its newest row set) compiles for the
 * GPU `gpu` and format `format`, each checked with fm_plan_check on that GPU (no problem
 * shape: bytes only).  Writes at most cap into out, the number written into *count,
 * all that matched into *total (if not NULL).
 * Statuses: FM_OK; FM_ERR_INVALID_ARG (NULL); FM_ERR_UNSUPPORTED for an unknown engine,
 * engine version, GPU or format (the detail lists the known ones), or when the engine
 * has no tactic for that GPU's architecture and format (the detail says what it has).
 * Outputs are written only on FM_OK. */
fm_status fm_tactics_check(const char *engine, const char *version, const char *gpu, const char *format,
                           fm_tactic_check *out, size_t cap, size_t *count, size_t *total);

/* Check n tactics (e.g. table rows with another cfg.cutlass) on gpu into out[0..n).
 * Statuses: FM_OK, FM_ERR_INVALID_ARG (NULL). out[i].tactic points into `tactics`. */
fm_status fm_tactics_recheck(const fm_gpu_info *gpu, const fm_tactic *tactics, fm_tactic_check *out, size_t n);

/* The whole table (for listing and tests). */
size_t           fm_tactic_count(void);
const fm_tactic *fm_tactic_at(size_t i); /* NULL past the end */

#ifdef __cplusplus
}
#endif
#endif
