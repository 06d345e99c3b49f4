# Mutation builds: the library with one safeguard compiled out, and the test that must
# catch it. Each is a ctest that PASSES when its test FAILS (tests/gpu/expect_fail.sh:
# the test ran on a device and failed an assertion; exit 77 without a device as usual).
# Off by default (a second CUDA build of the library); bench/gpu-check.sh turns it on:
#   cmake -DFM_TEST_MUTANTS=ON ...   ->   ctest -L mutant   (also in ctest -L gpu)
#
#   fp4moe_pdl_nowait / test_cuda_pdl_nowait: the kernels without the grid-dependency wait
#   (FM_TEST_PDL_NO_WAIT, src/cuda/kernel_common.cuh pdl_wait): test_cuda_pdl must fail.
if(FM_HAVE_CUDA AND FM_TEST_MUTANTS)
  # source properties are per directory: the units' and the .cu files' -gencode flags again
  include(${FM_GEN_DIR}/units.cmake)
  set_source_files_properties(${FM_CUDA_CU} PROPERTIES COMPILE_OPTIONS "${FM_GENCODE_ALL}")
  add_library(fp4moe_pdl_nowait STATIC ${FM_SRC})
  foreach(p INCLUDE_DIRECTORIES COMPILE_OPTIONS COMPILE_DEFINITIONS LINK_LIBRARIES POSITION_INDEPENDENT_CODE
            CUDA_SEPARABLE_COMPILATION INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS
            INTERFACE_LINK_LIBRARIES)
    get_target_property(v fp4moe ${p})
    if(v)
      set_target_properties(fp4moe_pdl_nowait PROPERTIES ${p} "${v}")
    endif()
  endforeach()
  target_compile_definitions(fp4moe_pdl_nowait PRIVATE FM_TEST_PDL_NO_WAIT=1)

  add_executable(test_cuda_pdl_nowait ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_pdl.c
                                      ${CMAKE_CURRENT_SOURCE_DIR}/testutil.c)
  target_include_directories(test_cuda_pdl_nowait PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(test_cuda_pdl_nowait PRIVATE ${FM_WARN})
  target_link_libraries(test_cuda_pdl_nowait PRIVATE fp4moe_pdl_nowait PkgConfig::CMOCKA PkgConfig::CJSON)
  add_test(NAME test_cuda_pdl_nowait
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu/expect_fail.sh $<TARGET_FILE:test_cuda_pdl_nowait>)
  set_tests_properties(test_cuda_pdl_nowait PROPERTIES LABELS "gpu;mutant" SKIP_RETURN_CODE 77)
endif()
