/* cmd_simulate.c - placeholder until its issue lands (removed from main.c if it does not). */
#include "cli.h"

int fm_cmd_simulate(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "fp4moe simulate: not built yet\n");
    return FM_EXIT_FAIL;
}
