# ep_py.cmake - the PCIe expert-parallel step (examples/ep_pcie.py, issue 35 items 3-4) over 1, 2
# and 4 spawned CPU ranks with torch.distributed (gloo) on fp4moe's CPU backend: tests/ep. It needs
# torch, which the project's venv has only after `scripts/deps.sh --engines` (FM_ENGINES=1 make
# test): without it tests/ep/run.py exits 77 and ctest reports the test skipped, saying what to
# install. Labels: engine (select with -L engine) and cpu. About 30 s on the 2-core machine.
fm_py_opt_test(ep_pcie ${CMAKE_CURRENT_SOURCE_DIR}/ep/run.py 600) # engines_py.cmake
