/* gemm_wgmma.cuh - the FP4 grouped GEMM on Hopper's warpgroup MMA (sm_90a).
 *
 * Same operation, weights and epilogues as gemm_mma.cuh (Y_e = X_e . W_e^T,
 * expert offsets on the device), same swap-AB orientation, but the MMA is
 * wgmma.mma_async m64nNk16 with
 *  - A = the dequantized weights, straight from registers: the register
 *    fragment of wgmma's A is, per warp, the m16n8k16 A fragment, which is what
 *    one prepacked 16-byte word per lane decodes to (src/cuda/prepack.c), so
 *    a weight element is decoded once per CTA and never stored back;
 *  - B = the token tile X[8*NT][KC], read by the tensor cores from shared
 *    memory in the 128-byte-swizzled K-major layout: per 64-K chunk c, the 64 K
 *    of one token row (8 core-matrix columns j of 16 B) fill one 128-byte line,
 *    8 token rows make one 1 KB swizzle atom, column j of row r sits at
 *    16 * (j ^ (r % 8)); stage tile = [chunk][token group][8 rows][128 B];
 *    descriptor (wg_issue, wgmma_common.cuh): MMA step s starts 32 B into the
 *    chunk's lines (the hardware applies the XOR), SBO (next 8 tokens) = 1 KB,
 *    layout bits = 128-byte swizzle. The K order inside a 64-K chunk is the
 *    prepack's, not the natural one: the prepacked A fragment of MMA step s
 *    holds, in lane (g, t), K = 16t + 4s + {0,1} (logical k 2t, 2t+1) and
 *    16t + 4s + {2,3} (logical k 2t+8, 2t+9) (so that gemm_mma.cuh reads X
 *    with 16-byte loads), so core-matrix column 2s + h of a chunk holds, in
 *    4-byte word t, X[16t + 4s + 2h .. +1]: the natural-X kernel loads the token
 *    tile into registers (16-byte loads) and stores it transposed (16-byte
 *    stores), one stage ahead; packed X (fm_cuda_x_pack) is already in that order
 *    and is copied by cp.async (the fragment conventions are checked by
 *    bench/probe/wgmma_rs_probe.cu, the whole kernel by tests/gpu);
 *  - N = 8*NT tokens per wgmma (up to 256), M = 64 features per warpgroup and
 *    m64 tile, MT tiles per warpgroup, 1, 2 or 3 warpgroups per CTA.
 * One CTA computes one (expert, 8*NT-token pass, feature block) tile; the 1-D
 * grid enumerates tiles expert by expert (each expert's weights and rows are
 * then read by CTAs that run at the same time: the L2 serves the re-reads),
 * and every warp finds its CTA's tile from the device offsets by a warp scan,
 * so the host never needs the row counts (graph-capturable). The persistent
 * form of the warp-specialized kernel (packed X, tiles with persist = 1)
 * launches at most one CTA per SM instead and each takes tiles blockIdx.x +
 * i * gridDim.x in the same order (wgmma_ws.cuh). The stage
 * weights and scale bytes come by cp.async, STAGES deep, one barrier a stage;
 * the tensor cores run stage k while the warps decode stage k+1 into a second
 * register set and store the token tile of stage k+2.
 * Epilogue: BF16 outputs (NONE, SWIGLU) of 16+-token tiles leave through the
 * drained stage buffers (the persistent kernel: a buffer of its own) as 16-byte
 * row segments (wg_staged / wg_epilogue_staged in wgmma_common.cuh, on
 * kernel_common.cuh's epilogue_staged, which the mma.sync kernel uses too; written
 * with stmatrix, per consumer warpgroup in the warp-specialized kernels) when y
 * is 16-byte aligned, FINALIZE_DET's FP32 rows where their tile fits; FINALIZE
 * and the 8-token tiles store from the registers (kernel_common.cuh's epilogue).
 * Shared memory = fm_smem_wgmma(tile) (src/kernels/fm_kernels_smem.c), all dynamic.
 * Instantiated one catalogue row per generated unit (gemm_wgmma_row.cuh), compiled
 * for sm_90a alone; launched by gemm_wgmma.cu through the build's unit table.
 */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "cuda/wgmma_rs.cuh"


namespace {
using namespace fm_kc;

#include "cuda/wgmma_common.cuh"
#include "cuda/wgmma_natural.cuh"
#include "cuda/wgmma_ws.cuh"
} // namespace
