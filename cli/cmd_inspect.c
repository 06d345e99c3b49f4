/* cmd_inspect.c - placeholder until its issue lands (removed from main.c if it does not). */
#include "cli.h"

int fm_cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "fp4moe inspect: not built yet\n");
    return FM_EXIT_FAIL;
}
