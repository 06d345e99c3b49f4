# run_golden.cmake - run one fp4moe command and compare its stdout and exit code with a
# golden file (tests/golden/*.txt: "exit N", then stdout, then stderr).
# cmake -DFM=<binary> -DGOLD=<file> -DARGS="a;b;c" [-DUPDATE=1] -P run_golden.cmake
execute_process(COMMAND ${FM} ${ARGS} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(got "exit ${rc}\n--- stdout\n${out}--- stderr\n${err}")
if(UPDATE)
  file(WRITE ${GOLD} "${got}")
  return()
endif()
file(READ ${GOLD} want)
if(NOT got STREQUAL want)
  file(WRITE ${GOLD}.actual "${got}")
  message(FATAL_ERROR "fp4moe ${ARGS}: output differs from ${GOLD} (actual in ${GOLD}.actual)\nstderr: ${err}")
endif()
