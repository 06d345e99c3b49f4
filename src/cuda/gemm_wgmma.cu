/* gemm_wgmma.cu - the FP4 grouped GEMM on Hopper's warpgroup MMA (sm_90a).
 *
 * Same operation, weights and epilogues as gemm_swapab.cu (Y_e = X_e . W_e^T,
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
 *    16t + 4s + {2,3} (logical k 2t+8, 2t+9) (so that gemm_swapab.cu reads X
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
 * Shared memory = fm_smem_wgmma(tile) (src/plan/fm_kernels_smem.c), all dynamic.
 * Only the sm_90a build has a body; the launcher refuses other devices.
 */
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

typedef void (*kernel_fn)(const fm_gemm_params, int);

/* The rows of src/plan/fm_tiles.def, in its order (= fm_wgmma_tiles()). fn: the
 * warp-specialized kernel for packed X (its smem is what fm_smem_wgmma counts);
 * fn_nat: the single-role kernel for natural X (the same smem less the unused
 * mbarrier bytes; it is launched with fm_smem_wgmma's size too). Each row is checked
 * at compile time (fields in the templates' ranges, shared memory within the opt-in
 * limit). */
struct entry {
    int       warps, mt, nt, kc, stages, persist;
    kernel_fn fn, fn_nat; /* fn_nat NULL: packed X only (the persistent kernel) */
};
#define FM_WGMMA_ENTRY_0(w, mt, nt, kc, st)                                                                          \
    {w, mt, nt, kc, st, 0, wgmma_ws_kernel<w, mt, nt, kc, st, false>, wgmma_kernel<w, mt, nt, kc, st>}
#define FM_WGMMA_ENTRY_1(w, mt, nt, kc, st) {w, mt, nt, kc, st, 1, wgmma_ws_kernel<w, mt, nt, kc, st, true>, NULL}
#define FM_WGMMA_TILE(w, mt, nt, kc, st, p)                                                                  \
    static_assert(FM_WGMMA_TILE_OK(w, mt, nt, kc, st, p) && FM_WGMMA_SMEM(w, mt, nt, kc, st, p) <= FM_SMEM_OPTIN_MAX, \
                  "fm_tiles.def: bad wgmma row w" #w "m" #mt "n" #nt "k" #kc "s" #st);
#include "plan/fm_tiles.def"
const entry k_entries[] = {
#define FM_WGMMA_TILE(w, mt, nt, kc, st, p) FM_WGMMA_ENTRY_##p(w, mt, nt, kc, st),
#include "plan/fm_tiles.def"
};
const int k_n_entries = sizeof(k_entries) / sizeof(k_entries[0]);
#define FM_WGMMA_MAX_DEV 64
size_t k_dyn_set[FM_WGMMA_MAX_DEV][sizeof(k_entries) / sizeof(k_entries[0])][2];

__global__ void x_pack_kernel(const uint4 *x, uint4 *out, int rows, int k)
{
    /* one thread per 16-byte output chunk j of a 64-column block: gathers 4 pairs */
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, nch = (long long)rows * (k / 8);
    if (i >= nch) return;
    long long row = i / (k / 8);
    int       c8 = (int)(i % (k / 8)), blk = c8 >> 3, j = c8 & 7;
    const uint32_t *src = (const uint32_t *)(x + row * (k / 8) + blk * 8); /* 32 pairs of the block */
    /* packed chunk j = core column (s, h) = j: pairs 8t + j for t = 0..3 */
    out[i] = make_uint4(src[j], src[8 + j], src[16 + j], src[24 + j]);
}

} // namespace

extern "C" int fm_wgmma_persistent(int idx) { return idx >= 0 && idx < k_n_entries && k_entries[idx].persist; }

/* CTAs of a launch: one per tile (an upper bound: the device has the counts), the
 * persistent kernel at most one per SM */
extern "C" long long fm_wgmma_grid(int idx, const fm_gemm_params *p)
{
    if (idx < 0 || idx >= k_n_entries) return -1;
    const entry &x = k_entries[idx];
    long long    tok = 8LL * x.nt;
    int          per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x.warps * x.mt / 2 : x.warps * x.mt; /* bands per CTA */
    int          bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    long long    nfb = (bands + per_cta - 1) / per_cta;
    /* sum over experts of ceil(m_e / tok) <= (max_rows + E*(tok-1)) / tok */
    long long passes = ((long long)p->max_rows + (long long)p->n_experts * (tok - 1)) / tok;
    long long tiles = nfb * passes;
    if (x.persist) {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        if (tiles > sms) tiles = sms; /* one CTA per SM: its registers and shared memory allow no second */
    }
    return tiles;
}

extern "C" int fm_wgmma_launch(int idx, const fm_gemm_params *p, size_t smem, void *stream)
{
    if (idx < 0 || idx >= k_n_entries) return (int)cudaErrorInvalidValue;
    const entry &x = k_entries[idx];
    int          dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return (int)cudaGetLastError();
    const int nat = !p->x_packed;
    kernel_fn fn = nat ? x.fn_nat : x.fn;
    if (!fn) return (int)cudaErrorInvalidValue; /* the launcher refuses natural X for it first */
    size_t   *set = dev >= 0 && dev < FM_WGMMA_MAX_DEV ? &k_dyn_set[dev][idx][nat] : NULL;
    if (!set || smem > *set) {
        cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess) return (int)err;
        if (set) *set = smem;
    }
    int       per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x.warps * x.mt / 2 : x.warps * x.mt;
    int       bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    int       nfb = (bands + per_cta - 1) / per_cta;
    long long grid = fm_wgmma_grid(idx, p);
    if (grid < 0) return (int)cudaErrorInvalidDevice;
    if (grid == 0) return 0; /* no rows: nothing to launch */
    if (grid > 0x7FFFFFFFLL) return (int)cudaErrorInvalidConfiguration;
    const int threads = (nat ? x.warps : x.warps + 4) * 32; /* packed X: + the producer warpgroup */
    if (p->pdl) {
        void *args[] = {(void *)p, (void *)&nfb};
        return (int)fm_launch_pdl((const void *)fn, dim3((unsigned)grid), dim3(threads), smem, stream, args);
    }
    fn<<<(unsigned)grid, threads, smem, (cudaStream_t)stream>>>(*p, nfb);
    return (int)cudaGetLastError();
}

extern "C" int fm_wgmma_occupancy(int idx, int x_packed, size_t smem, int *blocks, int *regs)
{
    if (idx < 0 || idx >= k_n_entries) return (int)cudaErrorInvalidValue;
    const entry &x = k_entries[idx];
    kernel_fn    fn = x_packed ? x.fn : x.fn_nat;
    if (!fn) return (int)cudaErrorInvalidValue;
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, fn, (x_packed ? x.warps + 4 : x.warps) * 32, smem);
    cudaFuncAttributes a;
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, fn);
    if (err == cudaSuccess) *regs = a.numRegs;
    return (int)err;
}

extern "C" int fm_wgmma_attributes(int idx, int x_packed, size_t *static_smem, size_t *max_dyn)
{
    if (idx < 0 || idx >= k_n_entries) return (int)cudaErrorInvalidValue;
    cudaFuncAttributes a;
    kernel_fn          fn = x_packed ? k_entries[idx].fn : k_entries[idx].fn_nat;
    if (!fn) return (int)cudaErrorInvalidValue;
    cudaError_t err = cudaFuncGetAttributes(&a, fn);
    if (err != cudaSuccess) return (int)err;
    if (static_smem) *static_smem = a.sharedSizeBytes;
    if (max_dyn) *max_dyn = (size_t)a.maxDynamicSharedSizeBytes;
    return 0;
}

extern "C" int fm_x_pack_launch(const uint16_t *x, uint16_t *out, int rows, int k, void *stream)
{
    long long nch = (long long)rows * (k / 8);
    if (nch <= 0) return 0;
    long long blocks = (nch + 255) / 256;
    if (blocks > 0x7FFFFFFFLL) return (int)cudaErrorInvalidConfiguration;
    x_pack_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>((const uint4 *)x, (uint4 *)out, rows, k);
    return (int)cudaGetLastError();
}
