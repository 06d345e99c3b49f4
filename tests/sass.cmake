# sass.cmake - ctest sass_fp8_mma: which FP8 MMAs are native on the build's targets, read from
# the SASS of gemm_fp8.cu (bench/probe/sass_mix.py with the pinned cuobjdump / nvdisasm wheels
# of scripts/requirements-headers.txt). What docs/formats.md says and issue 34's plan rests on:
# the wgmma W4A8 kernels issue native FP8 (QGMMA) on sm_90a; the mma.sync ones are lowered by
# ptxas to FP16 HMMAs with conversions there (sm_90a has no FP8 mma.sync), and native (QMMA) on
# sm_120f. An expectation that a new toolkit breaks fails here, so the docs get mended with it.
# Only the targets the build compiles (FM_TARGETS) are checked; exit 77 (skipped) without cuobjdump.
if(FM_HAVE_CUDA AND Python3_EXECUTABLE)
  set(_fm_sass_expect "")
  if("90a" IN_LIST FM_TARGETS)
    list(APPEND _fm_sass_expect --expect sm_90a:fp8mma_wg_kernel:native
                                --expect sm_90a:fp8mma_ws_kernel:native
                                --expect sm_90a:fp8mma_pipe_kernel:lowered
                                --expect sm_90a:fp8mma_staged_kernel:lowered)
  endif()
  if(FM_TARGETS MATCHES "120")
    list(APPEND _fm_sass_expect --expect sm_120:fp8mma_pipe_kernel:native
                                --expect sm_120:fp8mma_staged_kernel:native)
  endif()
  if(_fm_sass_expect)
    add_test(NAME sass_fp8_mma
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/probe/sass_mix.py
                     "$<FILTER:$<TARGET_OBJECTS:fp4moe>,INCLUDE,gemm_fp8\\.cu>" ${_fm_sass_expect})
    set_tests_properties(sass_fp8_mma PROPERTIES LABELS cpu SKIP_RETURN_CODE 77 TIMEOUT 300)
  endif()
endif()
