/* fm_kernels_smem.h - shared-memory model of fp4moe's own CUDA kernels.
 *
 * One function per kernel family computes the fm_smem_breakdown from a tile
 * configuration; the launcher (src/cuda/gemm_launch.c) sizes its dynamic shared
 * memory with the same function and refuses, with FM_ERR_SMEM_EXCEEDED, a
 * configuration over the limit, so a plan and a launch cannot disagree.
 *
 * Family "mma" (src/cuda/gemm_mma.cuh): the FP4 grouped GEMM for small
 * per-expert batches. Swap-AB: the weights are the MMA's M operand (16 output
 * features per mma.sync m16n8k16), the tokens its N operand (8 per fragment).
 * Each stage, staged by cp.async (`stages` deep, no mbarriers, no static smem):
 *   a  = the FP4 weights of the stage: warps*mt*(kc/64) chunks of 512 B (16 rows x 64 K,
 *        prepacked so that one 16-byte copy per lane is a whole A fragment)
 *   sf = their scale bytes: 64 B per chunk (16 rows x 4 blocks of 16)
 *   b  = the token tile X[8*nt rows][kc] BF16, each row padded by 16 B (padding) so
 *        that the 16-byte fragment reads are free of bank conflicts
 *
 *   dynamic smem = stages * (warps*mt*(kc/64)*(512 + 64) + 8*nt*(2*kc + 16))
 * (FM_MMA_SMEM: fm_tile_layout.h has both families' stage layouts, which the
 * kernels' offsets expand too; fm_tiles.def lists the compiled tiles.)
 */
#ifndef FM_KERNELS_SMEM_H
#define FM_KERNELS_SMEM_H

#include <stddef.h>

#include "fp4moe/kernels.h"
#include "fp4moe/smem.h"
#include "fp4moe/status.h"
#include "kernels/fm_tile_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tile of either family is an fm_tile (fp4moe/kernels.h: fields, name, parser,
 * equality). The fields' ranges per family: mma warps 1..8, mt 1/2/4 (with the
 * SwiGLU epilogue the first mt/2 bands are gate rows and the last mt/2 the matching up
 * rows), nt 1/2/4/8, kc 64..1024 step 64, stages 1..8, persist 0; wgmma below. */

/* Fill *out for tile t. Returns FM_OK, FM_ERR_INVALID_ARG (NULL) or
 * FM_ERR_BAD_SHAPE (a field outside the ranges above; *out untouched). */
fm_status fm_smem_mma(const fm_tile *t, fm_smem_breakdown *out);

/* Family "wgmma" (src/cuda/gemm_wgmma.cu, sm_90a only): the same swap-AB
 * tile read by warpgroup MMAs. The dequantized weights are wgmma's A operand
 * straight from registers (a warp's 16 rows of each m64 tile are exactly the
 * mma.sync A fragment the prepacked layout gives a lane), the token tile is
 * its B operand, read by the tensor cores from shared memory in the
 * 128-byte-swizzled K-major layout (a token row's 64 K = one 128-B line, 8 rows
 * = one 1 KB atom, no padding). Fields mean what they mean for mma: warps (4 or 8 = one or two
 * warpgroups), mt = 64-feature tiles per warpgroup = 16-row bands per warp
 * (1 or 2), nt = 8-token groups per pass (wgmma N = 8*nt: 1..32, a power of 2),
 * kc (64..256, step 64), stages (4..8). Each stage (weights by cp.async, the
 * token tile by 16-byte register stores):
 *   dynamic smem = stages * (roundup(warps*mt*(kc/64)*(512 + 64) + 8*nt*2*kc, 1024) + 16)
 * (each stage starts on a 1 KB boundary: the token tile is stored in the
 * 128-byte-swizzled layout, whose 1 KB atoms must be aligned; the rounding is
 * the breakdown's padding; the 16 B are the stage's full and empty mbarriers,
 * after the last stage). `warps` counts the consumer (MMA) warps: the CTA has
 * one more warpgroup, the producer that streams the stages. No static shared
 * memory. The per-tile kernels stage their BF16 output in the drained stage
 * buffers (nothing for the epilogue); the persistent kernel (persist = 1) keeps
 * loading the next tile's stages meanwhile, so its output tile has a buffer of
 * its own between the stages and the mbarriers:
 *   epilogue = 8*nt * (2 * warps*mt*16 + 16)   (token rows of BF16 features, +16 B a row)
 * counted as epi_d. */
fm_status fm_smem_wgmma(const fm_tile *t, fm_smem_breakdown *out);
fm_status fm_smem_wgmma_check(const fm_tile *t, size_t limit_bytes, fm_smem_breakdown *out);
/* The compiled wgmma instantiations, fastest-first per regime (see the .c). */
const fm_tile *fm_wgmma_tiles(size_t *count);
/* Index of t in fm_wgmma_tiles() (fm_tile_equal: a tile of the other family is not
 * found), or -1; also its index in gemm_wgmma.cu's table (both expand fm_tiles.def in
 * order). */
int fm_wgmma_tile_index(const fm_tile *t);
/* fm_tile_name with the family set to wgmma: "wgmma_w8m2n16k64s4" (persistent:
 * "wgmma_w8m1n32k64s4p") into buf. Returns buf. */
char *fm_wgmma_tile_name(const fm_tile *t, char *buf, size_t n);

/* fm_smem_mma and a limit check: FM_ERR_SMEM_EXCEEDED (with the breakdown in
 * the detail message, *out still filled) when out->total > limit_bytes. */
fm_status fm_smem_mma_check(const fm_tile *t, size_t limit_bytes, fm_smem_breakdown *out);

/* The tile configurations compiled into the library (the planner's candidates),
 * in the order the default heuristic prefers for small batches. *count gets the
 * number of entries. Never NULL. */
const fm_tile *fm_mma_tiles(size_t *count);
/* Index of t in fm_mma_tiles(), as fm_wgmma_tile_index (the build table's order, src/cuda/units.h). */
int fm_mma_tile_index(const fm_tile *t);
/* 1 if the compiled mma tile t also has the multi-block kernel (feature
 * blocks > 1, gemm_mma.cuh's FM_MMA_ENTRY_MB rows; test_cuda_gemm checks
 * the two lists agree), else 0. */
int fm_mma_tile_has_mb(const fm_tile *t);
/* Which compiled kernel of a tile runs: each tile has one to three (fm_tiles.def),
 * and registers (fp4moe_regs_sm90.inc), fitted efficiencies (fp4moe_cost_h200.inc)
 * and occupancy are per kernel. */
/* fm_kernel_variant, fm_variant_family and fm_variant_of: public, fp4moe/kernels.h */
/* Threads per block of kernel v of tile t, what its __launch_bounds__ say and what the
 * launcher and the occupancy model count: warps * 32, plus the producer warpgroup
 * (FM_WGMMA_PRODUCER_WARPS) for the packed-X and persistent wgmma kernels.
 * test_kernel_resources holds it to every compiled kernel's own bound
 * (build/kernel_bounds.csv, scripts/kernel_bounds.py). 0 for t NULL. */
int fm_kernel_threads(const fm_tile *t, fm_kernel_variant v);
/* FM_OK if fp4moe family f runs on arch, else FM_ERR_ARCH_MISMATCH with the reason
 * ("fp4moe-wgmma needs wgmma (sm_90a), not sm_120"): the ranking and the planner's
 * check ask it. */
fm_status fm_fp4moe_arch_check(fm_kernel_family f, const fm_arch_info *arch);
/* Bits of a GEMM operand element (0 for void); fm_elem_name is public. */
int fm_elem_bits(fm_elem e);
/* CTAs per SM of kernel v of tile t with `smem` bytes of dynamic shared memory on
 * arch (src/kernels/cost_fp4moe.c): the fewest of what shared memory, registers (the
 * sm_90a ptxas counts, fp4moe_regs_sm90.inc), threads (the packed-X wgmma kernels
 * count their producer warpgroup) and block slots allow. 0 if nothing fits. */
int fm_fp4moe_occupancy(const fm_arch_info *arch, const fm_tile *t, fm_kernel_variant v, size_t smem);
/* Registers per thread of that kernel in the sm_90a table (0: not in it). */
int fm_fp4moe_kernel_regs(const fm_tile *t, fm_kernel_variant v);

/* fm_tile_name with the family set to mma: "mma_w4m1n1k256s4". Returns buf. */
char *fm_mma_tile_name(const fm_tile *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
