/* gpu_table.c - named GPUs as data: SM count, memory bandwidth, dense tensor rates.
 *
 * Rates are dense (no 2:4 sparsity) TFLOP/s with FP32 accumulation, from the vendor
 * datasheets named in `source`.  Where a datasheet gives only sparse figures the
 * dense figure is half of it; where it gives only system figures (DGX/HGX) the
 * per-GPU figure is the system figure divided by the GPU count; where no figure
 * is published it is derived from a sibling part.  Every such derived figure has
 * its bit set in `estimated` and `fp4moe plan` prints it with a '~'.
 * GeForce parts (RTX 4090/5090) run FP32-accumulate tensor math at half the
 * FP16-accumulate rate; the table uses the FP32-accumulate figure.
 * Measured on our H200 (background.md): 4.17-4.21 TB/s copy, 734-745 TFLOP/s BF16
 * GEMM, 1,282 TFLOP/s FP8 GEMM - the table keeps the datasheet peak.
 */
#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "fm_internal.h"

static const fm_gpu_info k_gpus[] = {
    /* name, full name, cc, SMs, GB/s, BF16, FP8, FP4 (dense TFLOP/s), estimates, source */
    {"a100", "NVIDIA A100 SXM4 80GB", 80, 108, 2039, 312, 0, 0, 0, "NVIDIA A100 datasheet"},
    {"l40s", "NVIDIA L40S", 89, 142, 864, 362, 733, 0, 0, "NVIDIA L40S datasheet (sparse figures halved)"},
    {"rtx-4090", "NVIDIA GeForce RTX 4090", 89, 128, 1008, 165.2, 330.3, 0, 0,
     "NVIDIA Ada Lovelace architecture whitepaper, FP32-accumulate column"},
    {"h100-sxm", "NVIDIA H100 SXM5 80GB", 90, 132, 3350, 989, 1979, 0, 0, "NVIDIA H100 datasheet"},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", 90, 114, 2000, 756, 1513, 0, 0, "NVIDIA H100 datasheet"},
    {"h200", "NVIDIA H200 SXM 141GB", 90, 132, 4800, 989, 1979, 0, 0, "NVIDIA H200 datasheet"},
    {"b200", "NVIDIA B200", 100, 148, 8000, 2250, 4500, 9000, FM_EST_SMS | FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4,
     "NVIDIA DGX B200 datasheet divided by 8 GPUs, sparse halved"},
    {"b300", "NVIDIA B300 (Blackwell Ultra)", 103, 148, 8000, 2250, 4500, 13500,
     FM_EST_SMS | FM_EST_BW | FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4,
     "NVIDIA Blackwell Ultra announcement (DGX B300 system figures / 8); SM count as B200 (estimate)"},
    {"rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 120, 188, 1792, 500, 1000, 2000,
     FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4,
     "NVIDIA RTX PRO 6000 Blackwell datasheet (4,000 AI TOPS FP4 sparse, halved; FP8/BF16 scaled)"},
    {"rtx-pro-6000-ws", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 120, 188, 1792, 500, 1000, 2000,
     FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4, "NVIDIA RTX PRO 6000 Blackwell datasheet (as the server edition)"},
    {"rtx-5090", "NVIDIA GeForce RTX 5090", 120, 170, 1792, 209.5, 419, 1676, FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4,
     "NVIDIA RTX Blackwell GPU architecture whitepaper (3,352 AI TOPS FP4 sparse, halved; FP32-accumulate)"},
    {"dgx-spark", "NVIDIA DGX Spark (GB10)", 121, 48, 273, 62.5, 125, 500,
     FM_EST_SMS | FM_EST_BF16 | FM_EST_FP8 | FM_EST_FP4,
     "NVIDIA DGX Spark datasheet (1 PFLOP FP4 sparse, halved; 6,144 CUDA cores = 48 SMs)"},
};

/* Aliases people type (case-insensitive), each naming a row above. */
static const struct {
    const char *alias, *name;
} k_alias[] = {
    {"a100-sxm", "a100"},
    {"4090", "rtx-4090"},
    {"h100", "h100-sxm"},
    {"h200-sxm", "h200"},
    {"rtx-pro-6000-server", "rtx-pro-6000"},
    {"rtx-pro-6000-workstation", "rtx-pro-6000-ws"},
    {"rtxpro6000", "rtx-pro-6000"},
    {"5090", "rtx-5090"},
    {"gb10", "dgx-spark"},
    {"spark", "dgx-spark"},
};

size_t fm_gpu_count(void) { return FM_ARRAY_LEN(k_gpus); }

const fm_gpu_info *fm_gpu_at(size_t i) { return i < FM_ARRAY_LEN(k_gpus) ? &k_gpus[i] : NULL; }

fm_status fm_gpu_find(const char *name, const fm_gpu_info **out)
{
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_gpu_find: NULL argument");
    const char *want = name;
    for (size_t i = 0; i < FM_ARRAY_LEN(k_alias); i++)
        if (!strcasecmp(name, k_alias[i].alias)) want = k_alias[i].name;
    for (size_t i = 0; i < FM_ARRAY_LEN(k_gpus); i++)
        if (!strcasecmp(want, k_gpus[i].name)) {
            *out = &k_gpus[i];
            return FM_OK;
        }
    char known[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < FM_ARRAY_LEN(k_gpus) && used + 32 < sizeof known; i++) {
        size_t n = strlen(k_gpus[i].name);
        if (used) known[used++] = ' ';
        memcpy(known + used, k_gpus[i].name, n);
        used += n;
        known[used] = '\0';
    }
    return fm_fail(FM_ERR_NOT_FOUND, "unknown GPU '%s' (known: %s)", name, known);
}
