# `cmake --install` + pkg-config: a consumer program builds against the installed tree.
# Not under sanitizers (the consumer is built without them).
if(NOT FM_SANITIZE)
  add_test(NAME install_pkgconfig
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install/check.sh ${PROJECT_BINARY_DIR}
                   ${CMAKE_CURRENT_SOURCE_DIR}/install)
  set_tests_properties(install_pkgconfig PROPERTIES LABELS cpu)
endif()
