# Thrust and CUB come from CCCL, which ships with the CUDA toolkit. The host
# build uses them too (Thrust's OpenMP backend through explicit execution
# policies), so CCCL is found even when CUDA is off.
if(NOT TARGET CCCL::CCCL)
  set(_parallax_cccl_hints)
  foreach(_root IN ITEMS "$ENV{CUDA_PATH}" "$ENV{CUDA_HOME}" "${CUDAToolkit_ROOT}" /usr/local/cuda)
    if(_root)
      list(APPEND _parallax_cccl_hints "${_root}/lib64/cmake" "${_root}/lib/cmake")
    endif()
  endforeach()
  find_package(CCCL CONFIG REQUIRED HINTS ${_parallax_cccl_hints})
endif()
