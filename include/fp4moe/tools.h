/* fp4moe/tools.h - fp4moe's opt-in tools, on top of the runtime (fp4moe.h, which this
 * includes). An engine that only runs layers needs none of them; the CLI, the tests,
 * the benchmarks and the Python package include this header.
 *   fp4moe/smem.h     the shared-memory breakdown every kernel family's model fills
 *   fp4moe/plan.h     the shared-memory planner: CUTLASS SharedStorage bytes, can-it-run
 *                     check, ranked candidates (the audit)
 *   fp4moe/tactics.h  the serving engines' MoE tactic lists, checked per GPU
 *   fp4moe/io.h       safetensors checkpoints, .npy files
 *   fp4moe/sim.h      decode batching simulator
 */
#ifndef FP4MOE_TOOLS_H
#define FP4MOE_TOOLS_H

#include "fp4moe.h"
#include "fp4moe/smem.h"
#include "fp4moe/plan.h"
#include "fp4moe/tactics.h"
#include "fp4moe/io.h"
#include "fp4moe/sim.h"

#endif
