# Thrust and CUB for a CUDA configuration come from CCCL, which ships with the
# CUDA toolkit (a host build takes the system's Thrust instead:
# ParallaxFindThrust.cmake).
#
# Used twice: by parallax's own CMakeLists.txt (PARALLAX_FIND_AS_DEPENDENCY
# unset: a missing CCCL is a configure error) and by the installed
# parallax-config.cmake of a CUDA configuration (set: find_dependency, so a missing CCCL makes
# find_package(parallax) fail politely with the reason). CCCL::CCCL is a GLOBAL
# imported target, visible to every directory of the consumer.
if(NOT TARGET CCCL::CCCL)
  set(_parallax_cccl_hints)
  if(PARALLAX_CCCL_DIR_HINT)  # where parallax found it when it was configured
    list(APPEND _parallax_cccl_hints "${PARALLAX_CCCL_DIR_HINT}/..")
  endif()
  foreach(_root IN ITEMS "$ENV{CUDA_PATH}" "$ENV{CUDA_HOME}" "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" /usr/local/cuda)
    if(_root)
      list(APPEND _parallax_cccl_hints "${_root}/lib64/cmake" "${_root}/lib/cmake")
    endif()
  endforeach()
  if(PARALLAX_FIND_AS_DEPENDENCY)
    find_dependency(CCCL CONFIG HINTS ${_parallax_cccl_hints})
  else()
    find_package(CCCL CONFIG REQUIRED HINTS ${_parallax_cccl_hints})
  endif()
  unset(_parallax_cccl_hints)
endif()
