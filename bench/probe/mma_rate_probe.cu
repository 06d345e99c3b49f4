// mma_rate_probe.cu - the tensor rate of mma.sync per operand type on this GPU: BF16
// m16n8k16 against E4M3 m16n8k32 (FP32 accumulate), every warp issuing independent MMAs
// from registers (no memory traffic), so the figure is the pipe's issue rate. Decides
// whether a W4A8 path on mma.sync can pay on a target (issue 34): on sm_89 / sm_120 the
// E4M3 MMA is a native instruction (QMMA); on sm_90 / sm_100 it is not (ptxas emits
// F2FP + HMMA.F16 + FADD, found in the SASS 2026-12-07), wgmma / tcgen05 being their FP8 paths. Also checks the E4M3 fragment layout (A rows g, g+8, K 4t..4t+3 and
// 16+4t..; B K 4t..4t+3 and 16+4t.., column g) against a host product.
// Build: nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/probe/mma_rate_probe.cu
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

enum { CHAINS = 8, ITERS = 4096 };

/* One MMA of the operand type: BF16 m16n8k16 (E4M3 = false) or E4M3 m16n8k32 */
template <bool E4M3> __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    if (E4M3)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* CHAINS independent accumulators per thread, ITERS MMAs each, from registers. Every MMA has
 * operands of its own (A's first word is xored with the chain and the iteration): on a target
 * without an FP8 mma.sync (sm_90, sm_100: ptxas lowers E4M3 mma.sync to F2FP conversions, FP16
 * HMMAs from zero and FADDs into the accumulator) constant operands let ptxas compute the product
 * once and time the FADDs alone, which is what the first version of this probe measured (its
 * "1,837 TFLOP/s E4M3" on the H100, 2026-12-06, is not a tensor rate). The xor costs one integer
 * op per MMA on both sides. */
template <bool E4M3> __global__ void rate(float *out, uint32_t seed)
{
    const uint32_t b[2] = {seed * 3u, seed * 5u};
    uint32_t       a[4] = {seed, seed ^ 1u, seed ^ 2u, seed ^ 3u};
    float          c[CHAINS][4] = {};
    for (int it = 0; it < ITERS; it++)
#pragma unroll
        for (int ch = 0; ch < CHAINS; ch++) {
            a[0] = (a[0] ^ (uint32_t)(it * CHAINS + ch + 1)) & 0x3f3f3f3fu; /* finite codes either type */
            mma<E4M3>(c[ch], a, b);
        }
    float s = 0;
    for (int ch = 0; ch < CHAINS; ch++) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
    if (s == 12345.0f) out[0] = s;
}

/* One m16n8k32 E4M3 MMA of A [16][32] and B [32][8] codes, D [16][8] */
__global__ void layout_e4m3(const uint8_t *A, const uint8_t *B, float *D)
{
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    uint32_t  a[4], b[2];
    const int ar[4] = {g, g + 8, g, g + 8}, ak[4] = {4 * t, 4 * t, 16 + 4 * t, 16 + 4 * t};
    for (int q = 0; q < 4; q++) a[q] = *(const uint32_t *)(A + ar[q] * 32 + ak[q]);
    for (int q = 0; q < 2; q++) { /* B column g, K 4t..4t+3 (q 0), 16+4t.. (q 1); B stored [n][k] */
        b[q] = *(const uint32_t *)(B + g * 32 + 16 * q + 4 * t);
    }
    float c[4] = {0, 0, 0, 0};
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    D[g * 8 + 2 * t] = c[0], D[g * 8 + 2 * t + 1] = c[1], D[(g + 8) * 8 + 2 * t] = c[2], D[(g + 8) * 8 + 2 * t + 1] = c[3];
}

static float e4m3(uint8_t v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float f = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return s ? -f : f;
}

int main(void)
{
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    float *d;
    CK(cudaMalloc(&d, 128 * sizeof(float)));
    const int blocks = pr.multiProcessorCount * 8, threads = 256;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int k = 0; k < 2; k++) {
        float best = 1e30f;
        for (int rep = 0; rep < 5; rep++) {
            CK(cudaEventRecord(e0));
            if (k == 0) rate<false><<<blocks, threads>>>(d, 7u + rep);
            else rate<true><<<blocks, threads>>>(d, 7u + rep);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep && ms < best) best = ms;
        }
        const double kk = k == 0 ? 16 : 32;
        const double flops = 2.0 * 16 * 8 * kk * CHAINS * ITERS * (double)blocks * (threads / 32);
        printf("mma.sync %-28s %8.1f TFLOP/s (%d SMs, best of 4, %.3f ms)\n",
               k == 0 ? "m16n8k16 BF16 -> FP32" : "m16n8k32 E4M3 -> FP32", flops / best / 1e9, pr.multiProcessorCount,
               best);
    }
    /* layout check */
    uint8_t hA[16 * 32], hB[8 * 32];
    srand(1);
    for (int i = 0; i < 16 * 32; i++) hA[i] = (uint8_t)(rand() & 0x77); /* positive, exponent <= 14: finite */
    for (int i = 0; i < 8 * 32; i++) hB[i] = (uint8_t)(rand() & 0xF7);
    uint8_t *dA, *dB;
    CK(cudaMalloc(&dA, sizeof hA));
    CK(cudaMalloc(&dB, sizeof hB));
    CK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice));
    layout_e4m3<<<1, 32>>>(dA, dB, d);
    float hD[128];
    CK(cudaMemcpy(hD, d, sizeof hD, cudaMemcpyDeviceToHost));
    double maxrel = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0, sa = 0;
            for (int k = 0; k < 32; k++) s += (double)e4m3(hA[m * 32 + k]) * e4m3(hB[n * 32 + k]),
                                             sa += fabs((double)e4m3(hA[m * 32 + k]) * e4m3(hB[n * 32 + k]));
            double r = fabs(hD[m * 8 + n] - s) / (sa > 0 ? sa : 1);
            if (r > maxrel) maxrel = r;
        }
    printf("E4M3 fragment layout: max |D - host| / sum|a b| = %.3g (%s)\n", maxrel, maxrel < 1e-6 ? "ok" : "WRONG");
    return maxrel < 1e-6 ? 0 : 1;
}
