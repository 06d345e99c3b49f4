# SASS of the warp-specialized wgmma kernel + its stall breakdown
OUT=${OUT:-/tmp/out}
nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -O3 --expt-relaxed-constexpr -c src/cuda/gemm_wgmma.cu -o /tmp/wg.o
cuobjdump -sass /tmp/wg.o > $OUT/wgmma.sass
NCU_TILES="wgmma_w8m2n16k64s4 wgmma_w8m2n16k64s4_natx" bash bench/probe/gpu3.sh 2>&1 | tail -40
