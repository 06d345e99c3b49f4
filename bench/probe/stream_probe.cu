/* stream_probe.cu - how fast can the mma kernel's *load pattern* stream the
 * EP8-FC1 weights (32 experts x 4096 x 6144 FP4 = 403 MB) with no compute?
 * Separates "the access pattern / bytes in flight" from "the dequant + MMA work".
 *   ldg      : grid-stride LDG.128, 8 in flight per thread (read ceiling)
 *   cpasync  : the mma pattern: CTA of 4 warps, each warp one 16-row band, a
 *              stage = CPS 512-byte chunks per warp by 16-byte cp.async per lane,
 *              STAGES deep, cp.async.wait_group + __syncthreads per stage, a token
 *              consume of the lane's own bytes (so nothing is dead)
 *   bulk     : same, but each warp's stage is one cp.async.bulk (lane 0) completing
 *              on the warp's own mbarrier: no CTA barrier at all
 * CTAs per SM are set with padding shared memory. Build + run (device):
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/probe/stream_probe.cu -o /tmp/sp && /tmp/sp
 */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

static const int E = 32, N = 4096, K = 6144, KB = K / 64, BANDS = N / 16;

__global__ void ldg_kernel(const uint4 *src, size_t n16, unsigned *sink)
{
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = i + j * stride < n16 ? __ldcs(src + i + j * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 8; j++) acc ^= v[j].x ^ v[j].w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

__device__ __forceinline__ void cp16(void *s, const void *g)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}

template <int CPS, int STAGES>
__global__ void __launch_bounds__(128) cpasync_kernel(const uint4 *w, unsigned *sink)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.y, band = blockIdx.x * 4 + warp;
    const uint4 *src = w + ((size_t)e * BANDS + band) * KB * 32 + lane;
    const int nks = KB / CPS;
    constexpr int STAGE_B = 4 * CPS * 512;
    auto load = [&](int ks) {
        unsigned char *b = smem + (ks % STAGES) * STAGE_B + warp * CPS * 512 + lane * 16;
#pragma unroll
        for (int c = 0; c < CPS; c++) cp16(b + c * 512, src + (ks * CPS + c) * 32);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nks) load(s);
        asm volatile("cp.async.commit_group;");
    }
    unsigned acc = 0;
    for (int ks = 0; ks < nks; ks++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();
        if (ks + STAGES - 1 < nks) load(ks + STAGES - 1);
        asm volatile("cp.async.commit_group;");
        const unsigned char *b = smem + (ks % STAGES) * STAGE_B + warp * CPS * 512 + lane * 16;
#pragma unroll
        for (int c = 0; c < CPS; c++) acc ^= *(const unsigned *)(b + c * 512);
    }
    if (acc == 0x12345678u) *sink = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t *b, int n)
{
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(n));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(bytes));
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int phase)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
                     (unsigned)__cvta_generic_to_shared(b)),
                 "r"(phase));
}
__device__ __forceinline__ void bulk(void *s, const void *g, int bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (unsigned)__cvta_generic_to_shared(s)),
                 "l"(g), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}

/* each warp on its own: stage ring of STAGES x CPS*512 bytes, mbarrier per stage */
template <int CPS, int STAGES>
__global__ void __launch_bounds__(128) bulk_kernel(const uint4 *w, unsigned *sink)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t bars[4][STAGES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.y, band = blockIdx.x * 4 + warp;
    const unsigned char *src = (const unsigned char *)(w + ((size_t)e * BANDS + band) * KB * 32);
    const int nks = KB / CPS;
    constexpr int SB = CPS * 512;
    unsigned char *ring = smem + warp * STAGES * SB;
    if (lane == 0)
        for (int s = 0; s < STAGES; s++) mbar_init(&bars[warp][s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;");
    __syncwarp();
    if (lane == 0)
        for (int s = 0; s < STAGES - 1 && s < nks; s++) {
            mbar_expect_tx(&bars[warp][s], SB);
            bulk(ring + s * SB, src + (size_t)s * SB, SB, &bars[warp][s]);
        }
    unsigned acc = 0;
    for (int ks = 0; ks < nks; ks++) {
        int s = ks % STAGES;
        mbar_wait(&bars[warp][s], (ks / STAGES) & 1);
        const unsigned char *b = ring + s * SB + lane * 16;
#pragma unroll
        for (int c = 0; c < CPS; c++) acc ^= *(const unsigned *)(b + c * 512);
        __syncwarp();
        int nk = ks + STAGES - 1;
        if (lane == 0 && nk < nks) {
            int ns = nk % STAGES;
            mbar_expect_tx(&bars[warp][ns], SB);
            bulk(ring + ns * SB, src + (size_t)nk * SB, SB, &bars[warp][ns]);
        }
    }
    if (acc == 0x12345678u) *sink = acc;
}

template <class F> static float time_med(F f, int reps = 9)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = -2; r < reps; r++) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 0) t.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1e3f;
}

template <int CPS, int STAGES> static void run_cp(const uint4 *w, unsigned *sink, double bytes, int ctas_per_sm)
{
    int smem = STAGES * 4 * CPS * 512;
    int pad = std::max(smem, 227 * 1024 / ctas_per_sm - 1024);
    CK(cudaFuncSetAttribute(cpasync_kernel<CPS, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cpasync_kernel<CPS, STAGES>, 128, pad));
    float us = time_med([&] { cpasync_kernel<CPS, STAGES><<<dim3(BANDS / 4, E), 128, pad>>>(w, sink); });
    printf("cpasync  CPS=%d (%4d K) stages=%d  CTAs/SM=%d  %8.1f us  %.3f TB/s\n", CPS, CPS * 64, STAGES, occ, us,
           bytes / us / 1e6);
}
template <int CPS, int STAGES> static void run_bulk(const uint4 *w, unsigned *sink, double bytes, int ctas_per_sm)
{
    int smem = STAGES * 4 * CPS * 512;
    int pad = std::max(smem, 227 * 1024 / ctas_per_sm - 1024);
    CK(cudaFuncSetAttribute(bulk_kernel<CPS, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bulk_kernel<CPS, STAGES>, 128, pad));
    float us = time_med([&] { bulk_kernel<CPS, STAGES><<<dim3(BANDS / 4, E), 128, pad>>>(w, sink); });
    printf("bulk     CPS=%d (%4d K) stages=%d  CTAs/SM=%d  %8.1f us  %.3f TB/s\n", CPS, CPS * 64, STAGES, occ, us,
           bytes / us / 1e6);
}

int main()
{
    size_t bytes = (size_t)E * N * K / 2;
    uint4 *w;
    unsigned *sink;
    CK(cudaMalloc(&w, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(w, 0x5A, bytes));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("# %zu MB of weights (EP8-FC1), %d SMs\n", bytes >> 20, sms);
    for (int per : {4, 8, 16}) {
        float us = time_med([&] { ldg_kernel<<<sms * per, 256>>>(w, bytes / 16, sink); });
        printf("ldg      %d CTAs x 256 per SM            %8.1f us  %.3f TB/s\n", per, us, bytes / us / 1e6);
    }
    for (int c : {2, 4, 6, 8}) run_cp<4, 4>(w, sink, bytes, c);
    for (int c : {4, 8}) run_cp<2, 4>(w, sink, bytes, c);
    for (int c : {2, 4}) run_cp<4, 8>(w, sink, bytes, c);
    for (int c : {4, 6}) run_cp<8, 3>(w, sink, bytes, c);
    for (int c : {2, 4, 6, 8}) run_bulk<4, 4>(w, sink, bytes, c);
    for (int c : {4, 8}) run_bulk<8, 3>(w, sink, bytes, c);
    for (int c : {2, 4}) run_bulk<8, 6>(w, sink, bytes, c);
    return 0;
}
