# test_cuda_layer again under the cuda backend's switches, so that every check of the layer
# (cpu-ref, graph = eager, shards, set plans, tuning, bad ids, NaN x) holds on each path:
#  - FM_CUDA_PDL_CHAIN=0: the gather and the finalize reduce launched plainly, as before
#    2026-12-03 (the default launches them with programmatic dependent launch, as the GEMMs).
if(FM_HAVE_CUDA)
  add_test(NAME test_cuda_layer_no_pdl_chain COMMAND test_cuda_layer)
  set_tests_properties(test_cuda_layer_no_pdl_chain PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                       ENVIRONMENT "FM_CUDA_PDL_CHAIN=0;FM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
