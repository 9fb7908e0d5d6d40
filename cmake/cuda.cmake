# The CUDA backend's build switch (docs/gpu.md, "Building").
#
# TETRAD_CUDA = AUTO (default) | ON | OFF
#   AUTO: on where nvcc is found (CMAKE_CUDA_COMPILER, $CUDACXX, $CUDA_HOME/bin, $CUDA_PATH/bin,
#         /usr/local/cuda/bin, PATH) together with cuBLASLt; otherwise off with a one-line note,
#         and the build is exactly the CPU build (a fresh Debian 12 has no CUDA).
#   ON:   as AUTO, but a missing nvcc or cuBLASLt is a configure error.
#   OFF:  never.
# TETRAD_NCCL = AUTO | ON | OFF: the NCCL communicator (needs the CUDA backend). Without it GPU
#   runs communicate through the MPI communicator, staged through host memory.
# Targets: CMAKE_CUDA_ARCHITECTURES defaults to "80;90" (A100; H100/H200). Every kernel has a
#   portable path that compiles for both; nothing needs sm_90a today (no wgmma/TMA fast path is
#   built, see docs/gpu.md), so the 90a target is not added and nvcc compiles each .cu twice, not
#   three times (these machines have 2 shared cores).
set(TETRAD_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (where nvcc is found), ON, OFF")
set_property(CACHE TETRAD_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TETRAD_NCCL AUTO CACHE STRING "Build the NCCL communicator (with the CUDA backend): AUTO, ON, OFF")
set_property(CACHE TETRAD_NCCL PROPERTY STRINGS AUTO ON OFF)

set(TETRAD_CUDA_ENABLED OFF)
set(TETRAD_NCCL_ENABLED OFF)
string(TOUPPER "${TETRAD_CUDA}" _tetrad_cuda_mode)
if(NOT _tetrad_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TETRAD_CUDA must be AUTO, ON or OFF (got '${TETRAD_CUDA}')")
endif()

if(NOT _tetrad_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    if(DEFINED ENV{CUDACXX})
      set(_tetrad_nvcc "$ENV{CUDACXX}")
    else()
      find_program(_tetrad_nvcc nvcc
        HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
    endif()
    if(_tetrad_nvcc)
      set(CMAKE_CUDA_COMPILER "${_tetrad_nvcc}" CACHE FILEPATH "CUDA compiler" FORCE)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA targets (A100; H100/H200)" FORCE)
    endif()
    if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER "${CMAKE_CXX_COMPILER_LAUNCHER}")
    endif()
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "nvcc's host compiler")
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublasLt)
      set(TETRAD_CUDA_ENABLED ON)
    elseif(_tetrad_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "TETRAD_CUDA=ON: nvcc found (${CMAKE_CUDA_COMPILER}) but not the CUDA "
                          "toolkit's cuBLASLt; set CUDAToolkit_ROOT")
    endif()
  elseif(_tetrad_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TETRAD_CUDA=ON but no nvcc was found: set CMAKE_CUDA_COMPILER or "
                        "CUDA_HOME, or configure with -DTETRAD_CUDA=OFF")
  endif()
endif()

if(TETRAD_CUDA_ENABLED)
  string(TOUPPER "${TETRAD_NCCL}" _tetrad_nccl_mode)
  if(NOT _tetrad_nccl_mode STREQUAL "OFF")
    find_path(TETRAD_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} "$ENV{NCCL_HOME}/include")
    find_library(TETRAD_NCCL_LIBRARY nccl
      HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/lib" "$ENV{NCCL_HOME}/lib")
    if(TETRAD_NCCL_INCLUDE AND TETRAD_NCCL_LIBRARY)
      set(TETRAD_NCCL_ENABLED ON)
    elseif(_tetrad_nccl_mode STREQUAL "ON")
      message(FATAL_ERROR "TETRAD_NCCL=ON but nccl.h / libnccl were not found (set NCCL_HOME)")
    endif()
  endif()
  message(STATUS "tetrad: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "targets ${CMAKE_CUDA_ARCHITECTURES}); NCCL ${TETRAD_NCCL_ENABLED}")
else()
  message(STATUS "tetrad: CUDA backend OFF (TETRAD_CUDA=${TETRAD_CUDA}; no nvcc/cuBLASLt found "
                 "or switched off): CPU build")
endif()

# .cu files are C++17 (CMake 3.25, Debian 12's, knows no CUDA20 dialect for nvcc); they include
# only backend/cuda and core headers, which are C++17-clean.
# Adds the CUDA backend's sources, definitions and libraries to `target` (the library), or only
# the definitions saying it is absent.
function(tetrad_add_cuda_backend target)
  if(NOT TETRAD_CUDA_ENABLED)
    target_compile_definitions(${target} PUBLIC TETRAD_HAVE_CUDA=0 TETRAD_HAVE_NCCL=0)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tetrad/backend/cuda/*.cu
                                  ${PROJECT_SOURCE_DIR}/src/tetrad/backend/cuda/*.cpp)
  target_sources(${target} PRIVATE ${_cu})
  target_compile_definitions(${target} PUBLIC TETRAD_HAVE_CUDA=1)
  # The runtime is linked statically: one fewer shared library to find on a cluster node or to
  # carry to a lent machine (cuBLASLt and NCCL stay shared: they are large and ship with drivers'
  # software stacks and as Python wheels).
  target_link_libraries(${target} PUBLIC CUDA::cudart_static CUDA::cublasLt)
  target_include_directories(${target} PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
  if(TETRAD_NCCL_ENABLED)
    file(GLOB _nccl CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tetrad/comm/nccl_*.cpp)
    target_sources(${target} PRIVATE ${_nccl})
    target_compile_definitions(${target} PUBLIC TETRAD_HAVE_NCCL=1)
    target_include_directories(${target} PUBLIC ${TETRAD_NCCL_INCLUDE})
    target_link_libraries(${target} PUBLIC ${TETRAD_NCCL_LIBRARY})
  else()
    target_compile_definitions(${target} PUBLIC TETRAD_HAVE_NCCL=0)
  endif()
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                             CUDA_RUNTIME_LIBRARY Static)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-O3 -lineinfo -Xcompiler=-fno-trapping-math>)
endfunction()
