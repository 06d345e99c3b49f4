set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
SYS=/tmp/sysroot; for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvcc -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/probe/wgmma_rs_probe.cu -o /tmp/probe && /tmp/probe
for v in 0 1; do
  F=""; [ $v = 1 ] && F="-DFM_WGMMA_DESC_SWAP=1"
  cmake -S . -B build-g$v -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DCMAKE_CUDA_FLAGS="$F" >$OUT/cfg$v.log 2>&1
  cmake --build build-g$v -j16 --target test_cuda_gemm >$OUT/build$v.log 2>&1 || { tail -20 $OUT/build$v.log; continue; }
  echo "== variant $v"; build-g$v/tests/test_cuda_gemm >$OUT/t$v.log 2>&1; echo rc=$?
  grep -E "wgmma|FAILED|PASSED" $OUT/t$v.log | head -40
done
