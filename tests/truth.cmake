# The planner against every committed ground-truth CSV (tests/conformance/truth-*.csv,
# measured from real CUTLASS trees by make_truth.py; no CUTLASS needed here), one test
# per CUTLASS version, and for each a mutation test: one byte of one measured number
# changed in a copy must make the check fail.
if(Python3_EXECUTABLE)
  file(GLOB FM_TRUTH_CSV CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/conformance/truth-*.csv)
  foreach(csv ${FM_TRUTH_CSV})
    string(REGEX REPLACE ".*/truth-(.*)\\.csv$" "truth_\\1" v ${csv})
    add_test(NAME plan_${v}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/conformance/check_truth.py
                     $<TARGET_FILE:fp4moe_cli> ${csv})
    add_test(NAME plan_${v}_mutated
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/conformance/check_truth.py
                     $<TARGET_FILE:fp4moe_cli> ${csv} --mutate)
    set_tests_properties(plan_${v} plan_${v}_mutated PROPERTIES LABELS "cpu")
  endforeach()
endif()
