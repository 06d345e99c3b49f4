/* so.c - the one source of libfp4moe_dev.so (CMakeLists.txt, "the build tree's shared
 * library"): the static library linked whole is the rest. The tests and benchmarks link it
 * so that the kernels' machine code exists once in a build tree, not once per program. */
#include "fp4moe.h"

/* A shared library needs one object of its own; this one names what it is. */
const char *fm_dev_so_note(void);
const char *fm_dev_so_note(void) { return "libfp4moe_dev: the build tree's shared libfp4moe (tests, benchmarks)"; }
