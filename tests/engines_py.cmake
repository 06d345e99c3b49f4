# engines_py.cmake - the engine integrations' tests (tests/engines: fp4moe as transformers'
# experts implementation, python/fp4moe/transformers_experts.py) on the CPU backend. They need
# torch and transformers, which the project's venv has only after `scripts/deps.sh --engines`
# (FM_ENGINES=1 make test): without them tests/engines/run.py exits 77 and ctest reports the test
# skipped, saying what to install. Labels: engine (select with -L engine) and cpu.
# fm_py_opt_test(NAME SCRIPT TIMEOUT): a Python test of the project's interpreter on the shared
# library, labelled engine;cpu, skipped (77) when its packages are missing (also used by ep_py.cmake)
if(Python3_EXECUTABLE)
  set(FM_ENGINE_PY "${Python3_EXECUTABLE}")
else()
  set(FM_ENGINE_PY python3)
endif()
function(fm_py_opt_test name script timeout)
  if(TARGET fp4moe_shared)
    add_test(NAME ${name} COMMAND ${FM_ENGINE_PY} ${script})
    set_tests_properties(${name} PROPERTIES LABELS "engine;cpu" SKIP_RETURN_CODE 77 TIMEOUT ${timeout}
                         ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;FP4MOE_LIBRARY=$<TARGET_FILE:fp4moe_shared>;PYTHONDONTWRITEBYTECODE=1")
  endif()
endfunction()
fm_py_opt_test(engine_transformers ${CMAKE_CURRENT_SOURCE_DIR}/engines/run.py 900)

# The vLLM plugin's tests (tests/engines_vllm, python/fp4moe_vllm) on the CPU backend. vLLM pins a
# numpy and a transformers other than the project's venv's, so they run in a venv of their own
# (.venv-vllm or FM_VLLM_VENV, made by `scripts/deps.sh --vllm`); run.py re-executes itself
# there, or exits 77 (skipped) saying what to install.
fm_py_opt_test(engine_vllm ${CMAKE_CURRENT_SOURCE_DIR}/engines_vllm/run.py 900)
