/* arch_table.c - compute capabilities as data (one designated-initializer row each).
 *
 * Shared-memory figures: ../shared/docs/background.md is authoritative (it matches
 * the CUDA C++ Programming Guide, "Technical Specifications per Compute Capability",
 * and CUTLASS's cutlass/arch/arch.h: sm90/sm100 capacity 232,448 B, sm120 101,376 B).
 * The opt-in limit is the per-SM figure minus the 1 KB the driver reserves per block.
 * Threads/blocks/registers per SM: the same Programming Guide table.
 * sm_110 (Jetson Thor, formerly sm_101) and sm_121 (GB10) follow their family; rows
 * whose figures are inferred from the family say so in `source`.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"

#define KB 1024u
#define AMPERE (FM_FEAT_MMA_BF16)
#define ADA (FM_FEAT_MMA_BF16 | FM_FEAT_MMA_FP8)
#define HOPPER (FM_FEAT_MMA_BF16 | FM_FEAT_MMA_FP8 | FM_FEAT_WGMMA | FM_FEAT_TMA | FM_FEAT_CLUSTER)
#define DC_BLACKWELL (FM_FEAT_MMA_BF16 | FM_FEAT_MMA_FP8 | FM_FEAT_TMA | FM_FEAT_CLUSTER | FM_FEAT_TCGEN05 | FM_FEAT_FP4_MMA)
/* SM120 has TMA but GEMM kernels run with 1x1x1 clusters (no multicast: CUTLASS static_asserts it) */
#define GF_BLACKWELL (FM_FEAT_MMA_BF16 | FM_FEAT_MMA_FP8 | FM_FEAT_TMA | FM_FEAT_FP4_MMA)

#define SRC_GUIDE "CUDA C++ Programming Guide, compute capabilities table; background.md"

static const fm_arch_info k_archs[] = {
    /* name      cc   examples                          smem/SM     opt-in/block default  rsv  thr  blk  regs   features */
    {.name = "sm_80", .cc = 80, .examples = "A100",
     .smem_per_sm = 164 * KB, .smem_block_optin = 163 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 2048, .max_blocks_sm = 32, .regs_sm = 65536, .features = AMPERE, .source = SRC_GUIDE},
    {.name = "sm_86", .cc = 86, .examples = "RTX 3090, A40",
     .smem_per_sm = 100 * KB, .smem_block_optin = 99 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 1536, .max_blocks_sm = 16, .regs_sm = 65536, .features = AMPERE, .source = SRC_GUIDE},
    {.name = "sm_87", .cc = 87, .examples = "Jetson AGX Orin",
     .smem_per_sm = 164 * KB, .smem_block_optin = 163 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 1536, .max_blocks_sm = 16, .regs_sm = 65536, .features = AMPERE,
     .source = "CUDA C++ Programming Guide, compute capabilities table (not in background.md)"},
    {.name = "sm_89", .cc = 89, .examples = "RTX 4090, L40S",
     .smem_per_sm = 100 * KB, .smem_block_optin = 99 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 1536, .max_blocks_sm = 24, .regs_sm = 65536, .features = ADA, .source = SRC_GUIDE},
    {.name = "sm_90", .cc = 90, .examples = "H100, H200",
     .smem_per_sm = 228 * KB, .smem_block_optin = 227 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 2048, .max_blocks_sm = 32, .regs_sm = 65536, .features = HOPPER, .source = SRC_GUIDE},
    {.name = "sm_100", .cc = 100, .examples = "B200",
     .smem_per_sm = 228 * KB, .smem_block_optin = 227 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 2048, .max_blocks_sm = 32, .regs_sm = 65536, .features = DC_BLACKWELL, .source = SRC_GUIDE},
    {.name = "sm_103", .cc = 103, .examples = "B300",
     .smem_per_sm = 228 * KB, .smem_block_optin = 227 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 2048, .max_blocks_sm = 32, .regs_sm = 65536, .features = DC_BLACKWELL, .source = SRC_GUIDE},
    {.name = "sm_110", .cc = 110, .examples = "Jetson Thor",
     .smem_per_sm = 228 * KB, .smem_block_optin = 227 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 2048, .max_blocks_sm = 32, .regs_sm = 65536, .features = DC_BLACKWELL,
     .source = "CUDA C++ Programming Guide (cc 11.0, formerly sm_101); threads/blocks inferred from sm_100 (estimate)"},
    {.name = "sm_120", .cc = 120, .examples = "RTX PRO 6000, RTX 5090",
     .smem_per_sm = 100 * KB, .smem_block_optin = 99 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 1536, .max_blocks_sm = 32, .regs_sm = 65536, .features = GF_BLACKWELL, .source = SRC_GUIDE},
    {.name = "sm_121", .cc = 121, .examples = "DGX Spark (GB10)",
     .smem_per_sm = 100 * KB, .smem_block_optin = 99 * KB, .smem_block_default = 48 * KB, .smem_reserved = KB,
     .max_threads_sm = 1536, .max_blocks_sm = 32, .regs_sm = 65536, .features = GF_BLACKWELL, .source = SRC_GUIDE},
};

/* The table itself is the contract: the opt-in limit is always per-SM minus the reservation. */
_Static_assert(164 * KB - KB == 166912u, "sm_80 opt-in must be 166,912 B");
_Static_assert(99 * KB == 101376u, "sm_120 opt-in must be 101,376 B");
_Static_assert(227 * KB == 232448u, "sm_90/sm_100 opt-in must be 232,448 B");

size_t fm_arch_count(void) { return FM_ARRAY_LEN(k_archs); }

const fm_arch_info *fm_arch_at(size_t i) { return i < FM_ARRAY_LEN(k_archs) ? &k_archs[i] : NULL; }

fm_status fm_arch_get(int cc, const fm_arch_info **out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_arch_get: out is NULL");
    for (size_t i = 0; i < FM_ARRAY_LEN(k_archs); i++)
        if (k_archs[i].cc == cc) {
            *out = &k_archs[i];
            return FM_OK;
        }
    return fm_fail(FM_ERR_NOT_FOUND,
                   "unknown compute capability %d (known: 80 86 87 89 90 100 103 110 120 121)", cc);
}

/* Accepts "sm_120", "sm120", "SM_120a", "120", "12.0", "compute_120". */
fm_status fm_arch_find(const char *name, const fm_arch_info **out)
{
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_arch_find: NULL argument");
    const char *p = name;
    if (!strncmp(p, "compute_", 8)) p += 8;
    else if ((p[0] == 's' || p[0] == 'S') && (p[1] == 'm' || p[1] == 'M')) p += (p[2] == '_') ? 3 : 2;
    int cc = -1;
    if (isdigit((unsigned char)*p)) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (*end == '.' && isdigit((unsigned char)end[1]) && end[2] == '\0' && v < 20) {
            cc = (int)(v * 10 + (end[1] - '0'));
        } else if ((*end == '\0' || ((*end == 'a' || *end == 'f') && end[1] == '\0')) && v > 0 && v < 1000) {
            cc = (int)v;
        }
    }
    const fm_arch_info *a = NULL;
    if (cc > 0 && fm_arch_get(cc, &a) == FM_OK) {
        fm_clear_error();
        *out = a;
        return FM_OK;
    }
    return fm_fail(FM_ERR_NOT_FOUND,
                   "unknown architecture '%s' (known: sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_103 sm_110 sm_120 "
                   "sm_121)",
                   name);
}
