# Finds the CUDA toolkit and NCCL in the standard CUDA location (or CUDAToolkit_ROOT).
# Sets TIDE_HAVE_CUDA (and TIDE_HAVE_NCCL) and, when found, the imported targets
# CUDA::cudart, CUDA::cublas (examples/mlp_cuda.cu opens it at run time instead of linking it)
# and tide::nccl. Without them the build goes on with host-memory support only and says so once.
set(TIDE_HAVE_CUDA OFF)
set(TIDE_HAVE_NCCL OFF)
set(TIDE_CUDA_REASON "disabled by TIDE_CUDA=OFF")
if(TIDE_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(TIDE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
              ${CUDAToolkit_LIBRARY_ROOT}/include)
    find_library(TIDE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
                 ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(TIDE_NCCL_INCLUDE_DIR AND TIDE_NCCL_LIBRARY)
      add_library(tide::nccl UNKNOWN IMPORTED)
      set_target_properties(tide::nccl PROPERTIES IMPORTED_LOCATION ${TIDE_NCCL_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${TIDE_NCCL_INCLUDE_DIR})
      set(TIDE_HAVE_CUDA ON)
      set(TIDE_HAVE_NCCL ON)
      set(TIDE_CUDA_REASON "CUDA ${CUDAToolkit_VERSION}, NCCL ${TIDE_NCCL_LIBRARY}")
    else()
      set(TIDE_CUDA_REASON "CUDA ${CUDAToolkit_VERSION} found but NCCL not found")
    endif()
  else()
    set(TIDE_CUDA_REASON "CUDA toolkit not found")
  endif()
endif()
if(NOT TIDE_HAVE_CUDA)
  message(STATUS "tide: building without CUDA/NCCL: ${TIDE_CUDA_REASON}")
endif()
