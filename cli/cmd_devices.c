/* cmd_devices.c - `fp4moe devices`: every visible GPU through the CUDA runtime with
 * its shared-memory limits next to what the arch table says, the GPU targets this
 * build carries and which one each GPU runs (--json too).
 * No driver / no GPU / no CUDA build: one line on stderr and exit 3, no crash. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "flags.h"

typedef struct {
    int json, help;
} devices_opts;

static const fm_flag k_devices_flags[] = {
    /* not in the usage lines: the usage says it all */
    {"json", NULL, FM_FLAG_SWITCH, offsetof(devices_opts, json), .help = NULL},
    {"help", NULL, FM_FLAG_HELP, offsetof(devices_opts, help), .help = NULL},
};

static const fm_flag_cmd k_devices_cmd = {
    .cmd = "devices",
    .flags = k_devices_flags,
    .n_flags = sizeof k_devices_flags / sizeof k_devices_flags[0],
    .head = {"usage: fp4moe devices [--json]\n  lists visible GPUs: name, CC, SMs, shared memory "
             "default/opt-in/per SM/reserved, L2, memory bandwidth, and which of this build's GPU targets "
             "it runs (none: the build has no code for it)\nexit: 0 ok, 3 no GPU or driver\n"},
    .short_help = 1,
    .strict = 1,
    .unknown = {"unknown flag ", ""},
};

int fm_cmd_devices(int argc, char **argv)
{
    devices_opts    opt = {0};
    fm_flags_result r;
    int             rc = fm_flags_parse(&k_devices_cmd, argc, argv, &opt, &r);
    if (rc != FM_FLAGS_GO) return rc;
    const int json = opt.json;
    int n = 0;
    fm_status st = fm_device_count(&n);
    if (st != FM_OK) {
        fprintf(stderr, "fp4moe devices: no GPU available: %s (this build's GPU targets: %s)\n", fm_last_error(),
                fm_cuda_build_targets());
        return FM_EXIT_NO_DEVICE;
    }
    if (!json) printf("build: GPU targets %s\n", fm_cuda_build_targets());
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    for (int i = 0; i < n; i++) {
        fm_device_info d;
        if ((st = fm_device_query(i, &d)) != FM_OK) {
            cJSON_Delete(arr);
            return fm_cli_fail("devices", st);
        }
        const fm_arch_info *a = NULL;
        int known = fm_arch_get(d.cc, &a) == FM_OK;
        fm_cuda_device   *dev = NULL;
        fm_cuda_code_info code;
        char              code_err[512] = "";
        fm_status         code_st = fm_cuda_device_open(i, &dev);
        if (code_st == FM_OK) code_st = fm_cuda_device_code(dev, &code);
        if (code_st != FM_OK) snprintf(code_err, sizeof code_err, "%s", fm_last_error());
        fm_cuda_device_close(dev);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "index", d.index);
            cJSON_AddStringToObject(o, "name", d.name);
            cJSON_AddNumberToObject(o, "cc", d.cc);
            cJSON_AddNumberToObject(o, "sms", d.sms);
            cJSON_AddNumberToObject(o, "smem_block_default", (double)d.smem_block_default);
            cJSON_AddNumberToObject(o, "smem_block_optin", (double)d.smem_block_optin);
            cJSON_AddNumberToObject(o, "smem_per_sm", (double)d.smem_per_sm);
            cJSON_AddNumberToObject(o, "smem_reserved", (double)d.smem_reserved);
            cJSON_AddNumberToObject(o, "l2_bytes", (double)d.l2_bytes);
            cJSON_AddNumberToObject(o, "mem_gbs", d.mem_gbs);
            cJSON_AddBoolToObject(o, "matches_arch_table", known && a->smem_block_optin == d.smem_block_optin);
            cJSON_AddStringToObject(o, "build_targets", fm_cuda_build_targets());
            if (code_st == FM_OK) {
                cJSON_AddStringToObject(o, "code_target", code.running);
                cJSON_AddBoolToObject(o, "jit", code.jit);
                cJSON_AddNumberToObject(o, "mma_tiles", code.mma_tiles);
                cJSON_AddNumberToObject(o, "wgmma_tiles", code.wgmma_tiles);
            } else {
                cJSON_AddNullToObject(o, "code_target");
                cJSON_AddStringToObject(o, "code_error", code_err);
            }
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("GPU %d: %s  cc %d.%d  %d SMs\n", d.index, d.name, d.cc / 10, d.cc % 10, d.sms);
            printf("  shared memory: default %zu B/block, opt-in %zu B/block, %zu B/SM, reserved %zu B/block%s\n",
                   d.smem_block_default, d.smem_block_optin, d.smem_per_sm, d.smem_reserved,
                   !known ? " (arch not in the table)"
                   : a->smem_block_optin == d.smem_block_optin ? " (matches the arch table)"
                                                              : " (DIFFERS from the arch table)");
            printf("  L2 %zu B, memory %.0f GB/s%s\n", d.l2_bytes, d.mem_gbs,
                   d.mem_gbs > 0 ? " (from clock x bus width)" : " (runtime does not report clock/bus)");
            if (code_st == FM_OK)
                printf("  code: %s%s, %d mma + %d wgmma tiles\n", code.running,
                       code.jit ? " (PTX JIT-compiled by the driver at open: no machine code for this GPU)" : " (SASS)",
                       code.mma_tiles, code.wgmma_tiles);
            else printf("  code: none: %s\n", code_err);
        }
    }
    if (json) {
        fm_cli_print_json(arr);
    }
    return FM_EXIT_OK;
}
