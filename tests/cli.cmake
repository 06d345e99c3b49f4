# The CLI's flag table (test_cli_flags.c) is built from the CLI's own sources.
if(TARGET test_cli_flags)
  target_sources(test_cli_flags PRIVATE ${PROJECT_SOURCE_DIR}/cli/flags.c ${PROJECT_SOURCE_DIR}/cli/cli_util.c)
  target_include_directories(test_cli_flags PRIVATE ${PROJECT_SOURCE_DIR}/cli)
endif()
