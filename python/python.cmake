# python.cmake - the shared libfp4moe the Python package (python/fp4moe) loads
# with ctypes: the static library linked whole into one .so, plus abi.c (the
# struct layouts the binding checks at import). Included from the top-level
# CMakeLists.txt when FM_PYTHON is ON. Not built under sanitizers (a Python
# process would need the sanitizer runtime preloaded).
#
# In the build tree the library is ${PROJECT_BINARY_DIR}/python/libfp4moe.so
# (FP4MOE_LIBRARY points the package at it: tests/python.cmake). `pip install .`
# (scikit-build-core, pyproject.toml) installs it into the wheel next to the
# Python sources (fp4moe/libfp4moe.so); a plain `cmake --install` leaves it out
# so the C install (static library + pkg-config) stays as it was.
add_library(fp4moe_shared SHARED ${CMAKE_CURRENT_LIST_DIR}/abi.c)
target_compile_options(fp4moe_shared PRIVATE ${FM_WARN})
# Every object of the static library, not only those abi.c references: ctypes
# looks symbols up at run time, so the linker cannot know which are used.
target_link_libraries(fp4moe_shared PRIVATE -Wl,--whole-archive fp4moe -Wl,--no-whole-archive)
set_target_properties(fp4moe_shared PROPERTIES
    OUTPUT_NAME fp4moe
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python
    # the package finds the library next to itself, whatever the rpath says
    INSTALL_RPATH "$ORIGIN")
if(SKBUILD)
  install(TARGETS fp4moe_shared LIBRARY DESTINATION fp4moe COMPONENT python)
endif()
