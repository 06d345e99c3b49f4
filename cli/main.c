/* main.c - `fp4moe <subcommand> [flags]`: dispatch table and top-level help. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} fm_cli_cmd;

static const fm_cli_cmd k_cmds[] = {
    /* name       function         one-line summary */
    {"run",      fm_cmd_run,      "build a MoE layer, run it on the best backend, check it against the reference"},
    {"devices",  fm_cmd_devices,  "list visible GPUs with their shared-memory limits"},
    {"plan",     fm_cmd_plan,     "rank the GPU tiles that fit a GPU/format/epilogue/shape"},
    {"explain",  fm_cmd_explain,  "byte-by-byte shared-memory breakdown of one tile, the verdict and the fix"},
    {"simulate", fm_cmd_simulate, "from server settings to rows per expert, kernel efficiency and tokens/s"},
    {"advise",   fm_cmd_advise,   "the engine's dying tactics, rows per expert and the settings, kernels vs tokens/s"},
    {"inspect",  fm_cmd_inspect,  "list the tensors, formats, layers and experts of a safetensors checkpoint"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: fp4moe <command> [flags]   (fp4moe <command> --help for its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", k_cmds[i].name, k_cmds[i].summary);
    fprintf(f, "\nexit codes: 0 ok, 1 failed, 2 usage, 3 no GPU, 4 check mismatch, 5 configuration rejected\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return FM_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return FM_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fp4moe %s\n", fm_version());
        return FM_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "fp4moe: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return FM_EXIT_USAGE;
}
