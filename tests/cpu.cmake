# cpu.cmake - extra ctest registrations of the CPU MoE part (included by
# tests/CMakeLists.txt). A smoke run of the CPU benchmark on a reduced shard:
# it must build the layer, run the fast path and the reference, and exit 0
# (any library failure exits 1). Timings are printed, never asserted.
if(FM_BUILD_BENCH)
  add_test(NAME bench_cpu_smoke COMMAND bench_cpu --quick --runs 1 --ref-runs 1 --bw-mib 64)
  set_tests_properties(bench_cpu_smoke PROPERTIES LABELS cpu)
endif()
