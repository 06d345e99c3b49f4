# ep_py.cmake - the PCIe expert-parallel step (examples/ep_pcie.py, issue 35 items 3-4) over 1, 2
# and 4 spawned CPU ranks with torch.distributed (gloo) on fp4moe's CPU backend: tests/ep. It needs
# torch, which the project's venv has only after `scripts/deps.sh --engines` (FM_ENGINES=1 make
# test): without it tests/ep/run.py exits 77 and ctest reports the test skipped, saying what to
# install. Labels: engine (select with -L engine) and cpu. About 30 s on the 2-core machine.
if(TARGET fp4moe_shared)
  if(Python3_EXECUTABLE)
    set(FM_EP_PY "${Python3_EXECUTABLE}")
  else()
    set(FM_EP_PY python3)
  endif()
  add_test(NAME ep_pcie COMMAND ${FM_EP_PY} ${CMAKE_CURRENT_SOURCE_DIR}/ep/run.py)
  set_tests_properties(ep_pcie PROPERTIES LABELS "engine;cpu" SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;FP4MOE_LIBRARY=$<TARGET_FILE:fp4moe_shared>;PYTHONDONTWRITEBYTECODE=1")
endif()
