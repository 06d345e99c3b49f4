/* fp4moe.h - the runtime interface of fp4moe: mixture-of-experts layers with 4-bit
 * block-scaled weights (NVFP4, MXFP4) on NVIDIA GPUs and the CPU. What a serving
 * engine includes:
 *   fp4moe/status.h   statuses and per-call error detail
 *   fp4moe/format.h   E2M1/E4M3/UE8M0/BF16/FP16 codecs, NVFP4/MXFP4 quantization, scale layouts
 *   fp4moe/moe.h      layer configuration, routing, permutation, CPU reference
 *   fp4moe/layer.h    backends (cpu-ref, cpu, cuda), devices and running a layer
 *   fp4moe/arch.h     architectures and GPUs as data
 *   fp4moe/kernels.h  fp4moe's GEMM tiles and the ranking the launcher takes its tile from
 *   fp4moe/cuda.h     GPU grouped GEMM, weight prepack (builds with the CUDA backend)
 * The tools are opt-in, fp4moe/tools.h: the shared-memory planner's CUTLASS audit
 * (plan.h, smem.h), the engines' tactic tables (tactics.h), safetensors checkpoints
 * (io.h) and the decode batching simulator (sim.h).
 * Every function that can fail returns fm_status; fm_last_error() has the detail.
 */
#ifndef FP4MOE_H
#define FP4MOE_H

#include "fp4moe/status.h"
#include "fp4moe/format.h"
#include "fp4moe/moe.h"
#include "fp4moe/layer.h"
#include "fp4moe/arch.h"
#include "fp4moe/kernels.h"
#ifdef FM_HAVE_CUDA /* defined for users of a library built with nvcc (pkg-config / CMake target) */
#include "fp4moe/cuda.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* The library's version, "MAJOR.MINOR.PATCH": CMake's project(VERSION), the one
 * place it is written; `pkg-config --modversion fp4moe` and `fp4moe --version`
 * give the same. */
const char *fm_version(void);
#ifdef __cplusplus
}
#endif

#endif
