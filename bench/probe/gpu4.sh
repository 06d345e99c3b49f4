# SASS of the wgmma kernels (for instruction counts of the main loop)
OUT=${OUT:-/tmp/out}
nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -O3 --expt-relaxed-constexpr -c src/cuda/gemm_wgmma.cu -o /tmp/wg.o
cuobjdump -sass /tmp/wg.o > $OUT/wgmma.sass
ls -la $OUT/wgmma.sass
