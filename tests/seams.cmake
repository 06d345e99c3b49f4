# seams.cmake - checks of the library's structure (included by tests/CMakeLists.txt):
#   runtime_without_audit  no runtime object of libfp4moe references a symbol defined only
#                          in the audit objects (fp4moe_audit; tests/check_runtime_deps.py).
#                          The object lists come from the targets, so objects a moved
#                          source left behind in the build tree do not count.
#   include_graph          no circle of #include "..." in src/, include/, cli/
#                          (tests/include_graph.py)
if(Python3_EXECUTABLE)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/seams_runtime_objects.txt
       CONTENT "$<JOIN:$<FILTER:$<TARGET_OBJECTS:fp4moe>,EXCLUDE,/fp4moe_audit\\.dir/>,\n>\n")
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/seams_audit_objects.txt
       CONTENT "$<JOIN:$<TARGET_OBJECTS:fp4moe_audit>,\n>\n")
  add_test(NAME runtime_without_audit
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_runtime_deps.py
                   ${PROJECT_BINARY_DIR}/seams_runtime_objects.txt ${PROJECT_BINARY_DIR}/seams_audit_objects.txt)
  set_tests_properties(runtime_without_audit PROPERTIES LABELS cpu SKIP_RETURN_CODE 77)
  add_test(NAME include_graph COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/include_graph.py ${PROJECT_SOURCE_DIR})
  set_tests_properties(include_graph PROPERTIES LABELS cpu)
endif()
