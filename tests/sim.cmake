# The simulator's CLI test needs the fp4moe binary: point it there and build it first.
if(TARGET test_sim_cli)
  add_dependencies(test_sim_cli fp4moe_cli)
  set_property(TEST test_sim_cli APPEND PROPERTY ENVIRONMENT "FM_CLI=$<TARGET_FILE:fp4moe_cli>")
endif()
# `fp4moe simulate --measured bench/h200_fp4moe_gemm.csv` on GLM-5 EP8 and TP8, --validate
# and --calibrated-h200: the output parses and really comes from the measured table.
if(Python3_EXECUTABLE)
  add_test(NAME sim_measured_cli
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/sim_measured_cli.py
                   $<TARGET_FILE:fp4moe_cli> ${PROJECT_SOURCE_DIR})
  set_tests_properties(sim_measured_cli PROPERTIES LABELS "cpu")
endif()
