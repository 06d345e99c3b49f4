// wgmma_rs_probe.cu - checks the wgmma register-A / shared-B conventions gemm_wgmma.cu
// relies on, on the device: A (64x16 BF16) in the mma.m16n8k16 fragment layout per warp,
// B = X[N tokens][16 K] in the no-swizzle K-major core-matrix layout, both LBO/SBO orders.
// Build: nvcc -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/probe/wgmma_rs_probe.cu
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdint.h>
#include "cuda/wgmma_rs.cuh"

template <int N>
__global__ void probe(const float *A, const float *B, float *D, int swap, int kc)
{
    __shared__ __align__(1024) unsigned char sm[256 * 64 * 2];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // B: token r, k in [0,16): core (r/8, k/8) at ((r/8)*(kc/8) + k/8)*128 + (r%8)*16 + (k%8)*2
    for (int i = tid; i < N * 16; i += 128) {
        int r = i / 16, k = i % 16;
        __nv_bfloat16 v = __float2bfloat16(B[r * 16 + k]);
        if (swap < 2)
            *(__nv_bfloat16 *)(sm + ((r / 8) * (kc / 8) + k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2) = v;
        else { /* 128-byte swizzle; mode 3 puts the 16 K in columns 2,3 (MMA step 1) */
            int j = k / 8 + (swap == 3 ? 2 : 0);
            *(__nv_bfloat16 *)(sm + (r / 8) * 1024 + (r % 8) * 128 + ((j ^ (r % 8)) * 16) + (k % 8) * 2) = v;
        }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    uint32_t a[4];
    int rows[4] = {g, g + 8, g, g + 8}, ks[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int q = 0; q < 4; q++) {
        int m = warp * 16 + rows[q];
        __nv_bfloat162 p = __floats2bfloat162_rn(A[m * 16 + ks[q]], A[m * 16 + ks[q] + 1]);
        a[q] = *(uint32_t *)&p;
    }
    float d[N / 2];
    for (int j = 0; j < N / 2; j++) d[j] = 0;
    uint32_t s = (uint32_t)__cvta_generic_to_shared(sm);
    uint32_t lbo = swap ? kc * 16 : 128, sbo = swap ? 128 : kc * 16;
    if (swap >= 2) lbo = 16, sbo = 1024, s += swap == 3 ? 32 : 0;
    uint64_t desc = (uint64_t)((s & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
    if (swap >= 2) desc |= 1ull << 62;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    wgmma_rs_t<N>::run(d, a, desc);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int j = 0; j < N / 2; j++) asm volatile("" : "+f"(d[j])::"memory");
    for (int j = 0; j < N / 2; j++) {
        int n = (j / 4) * 8 + 2 * t + (j & 1), m = warp * 16 + g + 8 * ((j >> 1) & 1);
        D[m * N + n] = d[j];
    }
}

template <int N> static void run(int swap, int kc)
{
    float hA[64 * 16], hB[N * 16], hD[64 * N];
    for (int i = 0; i < 64 * 16; i++) hA[i] = (float)((i * 7) % 13 - 6);
    for (int i = 0; i < N * 16; i++) hB[i] = (float)((i * 5) % 11 - 5);
    float *dA, *dB, *dD;
    cudaMalloc(&dA, sizeof hA); cudaMalloc(&dB, sizeof hB); cudaMalloc(&dD, sizeof hD);
    cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
    cudaMemset(dD, 0xFF, sizeof hD);
    probe<N><<<1, 128>>>(dA, dB, dD, swap, kc);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost);
    double err = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            double r = 0;
            for (int k = 0; k < 16; k++) r += (double)hA[m * 16 + k] * hB[n * 16 + k];
            double x = fabs(r - hD[m * N + n]);
            if (!(x <= err)) err = x != x ? 1e30 : (x > err ? x : err);
        }
    static const char *mode[] = {"LBO=128 SBO=N-stride", "LBO=N-stride SBO=128", "SW128 step 0", "SW128 step 1 (+32 B)"};
    printf("probe N=%3d kc=%3d %s: max abs err %g (%s)\n", N, kc, mode[swap],
           err, cudaGetErrorString(e));
    cudaFree(dA); cudaFree(dB); cudaFree(dD);
}

int main()
{
    for (int swap = 0; swap < 4; swap++) {
        run<8>(swap, 64);
        run<16>(swap, 64);
        run<128>(swap, 64);
        run<128>(swap, 16);
    }
    return 0;
}
