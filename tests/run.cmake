# `fp4moe run` end to end: exit codes, messages, --json, --check on small layers.
add_test(NAME run_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_cli.sh $<TARGET_FILE:fp4moe_cli>)
set_tests_properties(run_cli PROPERTIES LABELS cpu ENVIRONMENT "PYTHON=${Python3_EXECUTABLE}")
