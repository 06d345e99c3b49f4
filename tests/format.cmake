# format.cmake - format tests beyond the cmocka programs: the ml_dtypes / numpy
# oracle (tests/py/codec_oracle.py) driving tests/format_dump.c.
# Python: the interpreter of every Python test, Python3_EXECUTABLE (the Makefile passes
# scripts/deps.sh's virtual environment; tests/CMakeLists.txt prefers .venv/), else python3
# on PATH.  Missing numpy/ml_dtypes make the test FAIL (not skip).
add_executable(format_dump ${CMAKE_CURRENT_SOURCE_DIR}/format_dump.c)
target_compile_options(format_dump PRIVATE ${FM_WARN})
target_link_libraries(format_dump PRIVATE ${FM_DEV_LIB})

if(Python3_EXECUTABLE)
  set(FM_FORMAT_PY "${Python3_EXECUTABLE}")
else()
  set(FM_FORMAT_PY python3)
endif()

add_test(NAME format_codec_oracle
         COMMAND ${FM_FORMAT_PY} ${CMAKE_CURRENT_SOURCE_DIR}/py/codec_oracle.py $<TARGET_FILE:format_dump>)
set_tests_properties(format_codec_oracle PROPERTIES LABELS cpu)
