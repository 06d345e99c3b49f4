# python.cmake - the Python package's tests (tests/python, pytest), run from the
# build tree against the shared library just built (python/python.cmake):
# PYTHONPATH points at the package sources, FP4MOE_LIBRARY at build/python/
# libfp4moe.so, FP4MOE_FORMAT_DUMP at the C format filter (bit-exactness).
# Python: the interpreter of every Python test, Python3_EXECUTABLE (the project
# venv's, scripts/deps.sh, as the Makefile passes it), else python3 on PATH. It needs
# numpy, ml-dtypes and pytest: without them the test FAILS (not skips). torch
# tests skip with a message when torch (or a GPU) is missing.
if(TARGET fp4moe_shared)
  if(Python3_EXECUTABLE)
    set(FM_PYTEST_PY "${Python3_EXECUTABLE}")
  else()
    set(FM_PYTEST_PY python3)
  endif()
  set(FM_PYTEST_ENV
      "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
      "FP4MOE_LIBRARY=$<TARGET_FILE:fp4moe_shared>"
      "FP4MOE_FORMAT_DUMP=$<TARGET_FILE:format_dump>"
      "PYTHONDONTWRITEBYTECODE=1")
  # -p no:cacheprovider: nothing written into the source tree
  add_test(NAME python_cpu
           COMMAND ${FM_PYTEST_PY} -m pytest -q -p no:cacheprovider -m "not gpu" ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(python_cpu PROPERTIES LABELS cpu ENVIRONMENT "${FM_PYTEST_ENV}")
  if(FM_HAVE_CUDA)
    add_test(NAME python_gpu
             COMMAND ${FM_PYTEST_PY} -m pytest -q -p no:cacheprovider -m gpu -rs ${CMAKE_CURRENT_SOURCE_DIR}/python)
    # pytest exits 5 when every test was skipped at collection (no torch, or no GPU: -rs
    # prints why): that is ctest's "skipped", as the C GPU tests' 77
    set_tests_properties(python_gpu PROPERTIES LABELS gpu ENVIRONMENT "${FM_PYTEST_ENV}" SKIP_RETURN_CODE 5)
    # The torch ops on CPU tensors (test_torch_cpu.py) need torch, which the project's venv
    # does not install (torch with its CUDA wheels is ~7 GB): python_cpu skips them; the GPU
    # machine has torch, and `ctest -L gpu` there runs them through this test.
    add_test(NAME python_torch_cpu
             COMMAND ${FM_PYTEST_PY} -m pytest -q -p no:cacheprovider -m "not gpu" -rs
                     ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_cpu.py)
    set_tests_properties(python_torch_cpu PROPERTIES LABELS gpu ENVIRONMENT "${FM_PYTEST_ENV}" SKIP_RETURN_CODE 5)
  endif()
endif()
