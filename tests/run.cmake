# `fp4moe run` end to end: exit codes, messages, --json, --check on small layers.
add_test(NAME run_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_cli.sh $<TARGET_FILE:fp4moe_cli>)
set_tests_properties(run_cli PROPERTIES LABELS cpu ENVIRONMENT "PYTHON=${Python3_EXECUTABLE}")
# ... and on the cuda backend (the device path, graph replay): label gpu, skips (77) without a device.
if(FM_HAVE_CUDA)
  add_test(NAME run_cli_gpu COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_cli_gpu.sh $<TARGET_FILE:fp4moe_cli>)
  set_tests_properties(run_cli_gpu PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 ENVIRONMENT "PYTHON=${Python3_EXECUTABLE}")
endif()
