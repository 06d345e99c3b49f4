# examples/nccl_ep/nccl_ep.cmake - the NCCL EP example (examples/nccl_ep/ep_step.c), built only
# with -DFM_NCCL_EP=ON (docs/ep-nccl.md). fp4moe builds and tests without it.
#
# Its dependencies come from PyPI wheels, installed by `scripts/deps.sh --nccl-ep` into
# .venv-nccl/ (scripts/requirements-nccl-ep.txt): nccl-extensions (nccl/ep/include/nccl_ep.h,
# nccl/ep/lib/cu12|cu13/libnccl_ep.so) and nvidia-nccl-cu13 (nvidia/nccl/include/nccl.h,
# nvidia/nccl/lib/libnccl.so.2). FM_NCCL_EP_ROOT is the site-packages folder that holds both.
file(GLOB _fm_nccl_site "${CMAKE_SOURCE_DIR}/.venv-nccl/lib/python3*/site-packages")
set(_fm_nccl_site_default "") # "" when the venv is not there (list(GET) of an empty list is an error)
if(_fm_nccl_site)
  list(SORT _fm_nccl_site)
  list(GET _fm_nccl_site -1 _fm_nccl_site_default)
endif()
set(FM_NCCL_EP_ROOT "${_fm_nccl_site_default}" CACHE PATH
    "site-packages holding nccl/ep (nccl-extensions) and nvidia/nccl (nvidia-nccl-cu13): scripts/deps.sh --nccl-ep")
if(NOT IS_DIRECTORY "${FM_NCCL_EP_ROOT}/nccl/ep")
  message(FATAL_ERROR "FM_NCCL_EP=ON: no nccl/ep under FM_NCCL_EP_ROOT='${FM_NCCL_EP_ROOT}'; "
                      "run scripts/deps.sh --nccl-ep or set FM_NCCL_EP_ROOT")
endif()

find_package(CUDAToolkit REQUIRED) # the example calls the CUDA runtime itself (graphs, events)
set(_fm_cu "cu${CUDAToolkit_VERSION_MAJOR}") # the wheel carries libnccl_ep.so for cu12 and cu13
find_path(FM_NCCL_EP_INCLUDE_DIR nccl_ep.h PATHS "${FM_NCCL_EP_ROOT}/nccl/ep/include" NO_DEFAULT_PATH)
find_path(FM_NCCL_INCLUDE_DIR nccl.h PATHS "${FM_NCCL_EP_ROOT}/nvidia/nccl/include" NO_DEFAULT_PATH)
find_library(FM_NCCL_EP_LIBRARY NAMES nccl_ep PATHS "${FM_NCCL_EP_ROOT}/nccl/ep/lib/${_fm_cu}" NO_DEFAULT_PATH)
find_library(FM_NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${FM_NCCL_EP_ROOT}/nvidia/nccl/lib" NO_DEFAULT_PATH)
foreach(_v FM_NCCL_EP_INCLUDE_DIR FM_NCCL_INCLUDE_DIR FM_NCCL_EP_LIBRARY FM_NCCL_LIBRARY)
  if(NOT ${_v})
    message(FATAL_ERROR "FM_NCCL_EP=ON: ${_v} not found under FM_NCCL_EP_ROOT='${FM_NCCL_EP_ROOT}' "
                        "(CUDA ${CUDAToolkit_VERSION_MAJOR}: nccl/ep/lib/${_fm_cu})")
  endif()
endforeach()

# libnccl_ep.so's SONAME is libnccl_ep.so.0, a name the wheel does not ship: link through a
# link of that name in the build tree, whose folder then goes into the binary's RUNPATH.
set(_fm_ep_libdir "${CMAKE_BINARY_DIR}/nccl_ep_lib")
file(MAKE_DIRECTORY "${_fm_ep_libdir}")
file(CREATE_LINK "${FM_NCCL_EP_LIBRARY}" "${_fm_ep_libdir}/libnccl_ep.so.0" SYMBOLIC)

if(NOT FM_HAVE_CUDA)
  message(WARNING "FM_NCCL_EP=ON without fp4moe's CUDA backend (FM_WITH_CUDA off or no nvcc): "
                  "fm_nccl_ep_step builds and links, and refuses to run (fm_cuda_device_open: FM_ERR_NO_BACKEND)")
endif()

add_executable(fm_nccl_ep_step "${CMAKE_CURRENT_LIST_DIR}/ep_step.c")
# SYSTEM: the third-party headers are not held to fp4moe's warning flags
target_include_directories(fm_nccl_ep_step SYSTEM PRIVATE "${FM_NCCL_EP_INCLUDE_DIR}" "${FM_NCCL_INCLUDE_DIR}")
target_compile_options(fm_nccl_ep_step PRIVATE ${FM_WARN})
# libnccl_ep.so compiles some kernels at first use from these headers (NCCL_EP_HOME, NCCL_HOME:
# the example sets them when the environment does not)
target_compile_definitions(fm_nccl_ep_step PRIVATE
  FM_NCCL_EP_HOME="${FM_NCCL_EP_ROOT}/nccl/ep" FM_NCCL_HOME="${FM_NCCL_EP_ROOT}/nvidia/nccl")
# libcuda: libnccl_ep.so needs it; where there is no driver, FindCUDAToolkit's is the
# toolkit's stub (lib64/stubs), enough to link (the driver's libcuda.so.1 is loaded at run time)
target_link_libraries(fm_nccl_ep_step PRIVATE fp4moe "${_fm_ep_libdir}/libnccl_ep.so.0" "${FM_NCCL_LIBRARY}"
                      CUDA::cudart_static CUDA::cuda_driver m)
message(STATUS "FM_NCCL_EP: fm_nccl_ep_step with ${FM_NCCL_EP_LIBRARY} and ${FM_NCCL_LIBRARY}")
