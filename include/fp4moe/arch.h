/* fp4moe/arch.h - GPU architectures and named GPUs as data, and the device query.
 *
 * The planner never needs a GPU: every limit it checks against comes from these
 * tables (one row per architecture, one row per named GPU, sources named in
 * src/arch/).  On a machine with a GPU, fm_device_query() reads the same limits
 * from the CUDA runtime so the two can be compared (`fp4moe devices`).
 */
#ifndef FP4MOE_ARCH_H
#define FP4MOE_ARCH_H

#include <stddef.h>

#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hardware features, a bit set per architecture. */
typedef enum {
    FM_FEAT_MMA_BF16 = 1u << 0, /* mma.sync with BF16 inputs (Ampere and later) */
    FM_FEAT_MMA_FP8 = 1u << 1,  /* FP8 (E4M3/E5M2) tensor-core MMA */
    FM_FEAT_WGMMA = 1u << 2,    /* warpgroup MMA (sm_90a only) */
    FM_FEAT_TMA = 1u << 3,      /* Tensor Memory Accelerator bulk copies */
    FM_FEAT_CLUSTER = 1u << 4,  /* thread-block clusters > 1 usable by GEMM kernels */
    FM_FEAT_TCGEN05 = 1u << 5,  /* tcgen05 / UMMA with tensor memory (datacenter Blackwell) */
    FM_FEAT_FP4_MMA = 1u << 6,  /* native block-scaled FP4 MMA (NVFP4 / MXFP4) */
} fm_arch_feature;

/* One compute capability. Shared-memory figures in bytes. */
typedef struct {
    const char *name;             /* "sm_120" */
    int         cc;               /* 120 = compute capability 12.0 */
    const char *examples;         /* "RTX PRO 6000, RTX 5090" */
    size_t      smem_per_sm;      /* shared memory per SM (max carveout) */
    size_t      smem_block_optin; /* per block with cudaFuncAttributeMaxDynamicSharedMemorySize */
    size_t      smem_block_default; /* per block without opt-in */
    size_t      smem_reserved;    /* reserved by the driver per block (cudaDevAttrReservedSharedMemoryPerBlock) */
    int         max_threads_sm;   /* resident threads per SM */
    int         max_blocks_sm;    /* resident blocks per SM */
    int         regs_sm;          /* 32-bit registers per SM */
    unsigned    features;         /* fm_arch_feature bits */
    const char *source;           /* where the figures come from */
} fm_arch_info;

size_t              fm_arch_count(void);
const fm_arch_info *fm_arch_at(size_t i); /* NULL when i >= fm_arch_count() */

/* Find an architecture by name: "sm_120", "sm120", "120", "sm_120a", "12.0".
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL argument) or FM_ERR_NOT_FOUND (unknown
 * architecture; the detail lists the known ones). *out is untouched on failure. */
fm_status fm_arch_find(const char *name, const fm_arch_info **out);
/* Same by compute capability number (90, 120, ...). Same statuses. */
fm_status fm_arch_get(int cc, const fm_arch_info **out);

/* Which figures of a GPU row are estimates rather than vendor specifications. */
typedef enum {
    FM_EST_SMS = 1u << 0,
    FM_EST_BW = 1u << 1,
    FM_EST_BF16 = 1u << 2,
    FM_EST_FP8 = 1u << 3,
    FM_EST_FP4 = 1u << 4,
} fm_gpu_estimate;

/* One named GPU. Rates are dense (no structured sparsity), FP32 accumulation. */
typedef struct {
    const char *name;       /* short name used on the command line: "rtx-pro-6000" */
    const char *full_name;  /* "NVIDIA RTX PRO 6000 Blackwell Server Edition" */
    int         cc;         /* compute capability, a row of the arch table */
    int         sms;        /* streaming multiprocessors */
    double      mem_gbs;    /* memory bandwidth, GB/s (1e9 B/s) */
    double      bf16_tflops;
    double      fp8_tflops; /* 0 = no FP8 tensor cores */
    double      fp4_tflops; /* 0 = no native FP4 MMA */
    unsigned    estimated;  /* fm_gpu_estimate bits */
    const char *source;
} fm_gpu_info;

size_t             fm_gpu_count(void);
const fm_gpu_info *fm_gpu_at(size_t i); /* NULL when i >= fm_gpu_count() */

/* Find a GPU by short name or alias ("rtx-pro-6000", "h200", "b200", "5090"),
 * case-insensitive. Returns FM_OK, FM_ERR_INVALID_ARG or FM_ERR_NOT_FOUND (the
 * detail lists the known names). *out is untouched on failure. */
fm_status fm_gpu_find(const char *name, const fm_gpu_info **out);

/* ---- devices through the CUDA runtime ------------------------------------ */

typedef struct {
    int    index;
    char   name[256];
    int    cc;               /* major * 10 + minor */
    int    sms;
    size_t smem_block_default;
    size_t smem_block_optin;
    size_t smem_per_sm;
    size_t smem_reserved;
    size_t l2_bytes;
    size_t global_mem;
    int    mem_clock_khz;    /* 0 when the runtime does not report it */
    int    bus_width_bits;   /* 0 when the runtime does not report it */
    double mem_gbs;          /* 2 * clock * bus width / 8 (DDR); 0 when unknown */
} fm_device_info;

/* Number of visible CUDA devices.
 * Returns FM_OK (n >= 1), FM_ERR_NO_DEVICE (no driver, no device: the detail says
 * which), FM_ERR_NO_BACKEND (built without CUDA) or FM_ERR_INVALID_ARG. */
fm_status fm_device_count(int *n);

/* Limits of device `index` (0-based).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL out), FM_ERR_OUT_OF_RANGE (bad index),
 * FM_ERR_NO_DEVICE, FM_ERR_CUDA (a runtime call failed) or FM_ERR_NO_BACKEND. */
fm_status fm_device_query(int index, fm_device_info *out);

#ifdef __cplusplus
}
#endif
#endif
