# The simulator's CLI test needs the fp4moe binary: point it there and build it first.
if(TARGET test_sim_cli)
  add_dependencies(test_sim_cli fp4moe_cli)
  set_property(TEST test_sim_cli APPEND PROPERTY ENVIRONMENT "FM_CLI=$<TARGET_FILE:fp4moe_cli>")
endif()
