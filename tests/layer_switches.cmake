# test_cuda_layer again with the layer's launch options, so that every check of the layer
# (cpu-ref, graph = eager, shards, set plans, tuning, bad ids, NaN x) holds on each path:
#  - fm_layer_desc.pdl_chain = FM_PDL_CHAIN_OFF: the gather and the finalize reduce launched
#    plainly (the default launches them with programmatic dependent launch, as the GEMMs);
#    the test program reads FM_TEST_PDL_CHAIN_OFF=1 and sets the field on every layer it makes.
if(FM_HAVE_CUDA)
  add_test(NAME test_cuda_layer_no_pdl_chain COMMAND test_cuda_layer)
  set_tests_properties(test_cuda_layer_no_pdl_chain PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                       ENVIRONMENT "FM_TEST_PDL_CHAIN_OFF=1;FM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
