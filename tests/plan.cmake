# Planner checks beyond the cmocka programs: conformance against the real CUTLASS
# headers (tests/conformance/), byte for byte.  Compiled probe results are cached in
# the build folder, keyed by CUTLASS version + probe source hash.
if(Python3_EXECUTABLE)
  add_test(NAME plan_conformance
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/conformance/run_conformance.py
                   $<TARGET_FILE:fp4moe_cli> ${CMAKE_BINARY_DIR}/conformance-cache)
  set_tests_properties(plan_conformance PROPERTIES LABELS "cpu;conformance" TIMEOUT 900)
  add_test(NAME plan_cli_devices_no_gpu
           COMMAND ${Python3_EXECUTABLE} -c
           "import subprocess,sys; r=subprocess.run([sys.argv[1],'devices'],capture_output=True,text=True); e=r.stderr.strip().splitlines(); sys.exit(0 if r.returncode in (0,3) and (r.returncode==0 or len(e)==1) else 1)"
           $<TARGET_FILE:fp4moe_cli>)
  set_tests_properties(plan_cli_devices_no_gpu PROPERTIES LABELS "cpu")
endif()
# The CLI exit-code contract (test_plan_cli.c) runs the fp4moe binary.
if(TARGET test_plan_cli)
  add_dependencies(test_plan_cli fp4moe_cli)
  set_property(TEST test_plan_cli APPEND PROPERTY ENVIRONMENT "FM_CLI=$<TARGET_FILE:fp4moe_cli>")
endif()
# test_plan_rank also carries the label "rank": it exits 77 (skipped) while a compiled tile
# has no timing in bench/h200_fp4moe_tiles.csv (a refit on the GPU is owed); `ctest -L rank`.
if(TEST test_plan_rank)
  set_property(TEST test_plan_rank APPEND PROPERTY LABELS rank)
endif()
