# Helpers for parallax's own tests, examples and benchmarks.
#
# parallax_add_executable(<name> SOURCES <src>... [LIBS <lib>...] [CUDA_TWIN])
#   Builds <name> from the sources as C++. With CUDA_TWIN and a CUDA
#   configuration, also builds <name>_cuda from the same sources compiled by
#   nvcc, so templated code is instantiated for CudaSpace too.
#
# In a CUDA configuration every program compiled by the C++ compiler alone is
# left out of `all` (PARALLAX_CUDA_BUILD_HOST_COPIES=OFF, the default): the C++
# <name> of an executable that has a twin, and the host-only programs (the
# MPI benchmarks, the fault drill, the fuzz replays, the README example). Their
# C++ translation units see no CUDA code (the umbrella adds the .cuh headers
# under nvcc only), so the host configuration builds and runs exactly these
# programs, and CI builds both configurations on the same machine: compiling
# them again would only cost time (about 2 minutes of CI). Each stays a
# target: `cmake --build <dir> --target <name>` builds it.
#
# parallax_host_only(<target>...) applies that rule to targets made otherwise.
#
# PARALLAX_CUDA_TWINS_COMPILE_ONLY=ON (CI's CUDA build, which runs nothing)
# makes each twin an object library whose sources nvcc takes through both
# front ends only (-cuda: cudafe++ on the host side, cicc and ptxas on the
# device side), without the host compiler's pass over cudafe++'s output or a
# link: no program, and no test, is made of a twin. The GPU-only tests, 04 and
# bench_gpu still compile whole and link (docs/testing.md, "Build time").
#
# parallax_is_program(<target> <var>) sets <var> to whether <target> is an
# executable this configuration builds, so that tests are added only for those.

set(PARALLAX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wno-unknown-pragmas)
include(CheckCXXCompilerFlag)

# Intel's JCC erratum: on Skylake-derived cores (this project's development
# machine among them) the microcode fix keeps any jump that crosses or ends on
# a 32-byte boundary out of the decoded-instruction cache, so the speed of a
# tight loop changes with where unrelated code moves it. GNU as can pad those
# jumps; parallax's own programs ask for it where the toolchain can (x86 with
# GNU as). docs/benchmarks.md, "Build flags": word_lm's logits kernel took
# 9.5% of a 4-rank step instead of 7% when an edit elsewhere moved it.
# With GCC's default loop alignment (16 bytes) where a short hot loop falls
# against the cache's 32-byte windows and 64-byte lines moves with unrelated
# code: the logits kernel's 28-byte dot-product loop took 13% of a 4-rank
# step instead of 9.5% when an edit elsewhere moved it across a 64-byte line.
# -falign-loops=32 starts every loop on a 32-byte boundary.
option(PARALLAX_ALIGN_BRANCHES
  "Pad jumps off 32-byte boundaries and start loops on one in parallax's own programs (x86, GNU as)" ON)
if(PARALLAX_ALIGN_BRANCHES)
  check_cxx_compiler_flag("-Wa,-mbranches-within-32B-boundaries" PARALLAX_HAVE_ALIGN_BRANCHES)
  check_cxx_compiler_flag("-falign-loops=32" PARALLAX_HAVE_ALIGN_LOOPS)
endif()

# errno: C's sqrt() must set errno for a negative argument, so under GCC's
# and Clang's default -fmath-errno every std::sqrt is an instruction plus a
# compare and a branch to the library call, and a loop holding one does not
# vectorise. Adagrad's and Adam's rules have one per element: their sparse
# update ran 1.7-2.1x faster without errno (docs/benchmarks.md, "Row kernels").
# Nothing in parallax or its programs reads errno after a math call, and the
# results are the same bits (sqrt and division are correctly rounded either
# way), so parallax's own programs are built without it.
option(PARALLAX_NO_MATH_ERRNO "Build parallax's own programs with -fno-math-errno (GCC, Clang)" ON)
if(PARALLAX_NO_MATH_ERRNO)
  check_cxx_compiler_flag("-fno-math-errno" PARALLAX_HAVE_NO_MATH_ERRNO)
endif()

option(PARALLAX_CUDA_TWINS_COMPILE_ONLY
  "In a CUDA configuration, compile the CUDA twins through nvcc's front ends only (no host pass, no link, no tests)" OFF)

function(parallax_is_program target var)
  set(_is FALSE)
  if(TARGET ${target})
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      set(_is TRUE)
    endif()
  endif()
  set(${var} ${_is} PARENT_SCOPE)
endfunction()

option(PARALLAX_CUDA_BUILD_HOST_COPIES
  "In a CUDA configuration, also build by default the C++ copies of executables that have a CUDA twin" OFF)

function(_parallax_configure_target target)
  target_link_libraries(${target} PRIVATE parallax::parallax)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${PARALLAX_WARNINGS}>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PARALLAX_HAVE_ALIGN_BRANCHES}>>:-Wa,-mbranches-within-32B-boundaries>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PARALLAX_HAVE_ALIGN_LOOPS}>>:-falign-loops=32>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PARALLAX_HAVE_NO_MATH_ERRNO}>>:-fno-math-errno>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${PARALLAX_HAVE_NO_MATH_ERRNO}>>:-Xcompiler=-fno-math-errno>
    $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda --expt-relaxed-constexpr -Xcompiler=-Wall>)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF CUDA_EXTENSIONS OFF)
endfunction()

function(parallax_host_only)
  if(PARALLAX_ENABLE_CUDA AND NOT PARALLAX_CUDA_BUILD_HOST_COPIES)
    set_target_properties(${ARGN} PROPERTIES EXCLUDE_FROM_ALL TRUE)
  endif()
endfunction()

function(parallax_add_executable name)
  cmake_parse_arguments(ARG "CUDA_TWIN" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  _parallax_configure_target(${name})
  if(ARG_LIBS)
    target_link_libraries(${name} PRIVATE ${ARG_LIBS})
  endif()
  if(NOT ARG_SOURCES MATCHES "\\.cu(;|$)")
    parallax_host_only(${name})  # a twin, if asked for, is what the CUDA configuration builds
  endif()
  if(ARG_CUDA_TWIN AND PARALLAX_ENABLE_CUDA)
    # Copies of the C++ sources with a .cu name, so nvcc compiles them (a
    # source file has one language per directory, so the original cannot be
    # both). The copies keep their path below the source directory, so two
    # sources with the same file name do not collide. Quoted includes resolve
    # through the original sources' directories, added as include directories.
    set(_cu_sources)
    set(_src_dirs "${CMAKE_CURRENT_SOURCE_DIR}")
    foreach(_src IN LISTS ARG_SOURCES)
      get_filename_component(_abs "${_src}" ABSOLUTE)
      if(NOT _abs MATCHES "\\.(cpp|cc|cxx)$")
        list(APPEND _cu_sources "${_abs}")  # headers and the like, as they are
        continue()
      endif()
      get_filename_component(_dir "${_abs}" DIRECTORY)
      list(APPEND _src_dirs "${_dir}")
      file(RELATIVE_PATH _rel "${CMAKE_CURRENT_SOURCE_DIR}" "${_abs}")
      if(_rel MATCHES "^\\.\\./" OR IS_ABSOLUTE "${_rel}")
        get_filename_component(_rel "${_abs}" NAME)
      endif()
      string(REGEX REPLACE "\\.(cpp|cc|cxx)$" ".cu" _rel "${_rel}")
      set(_cu "${CMAKE_CURRENT_BINARY_DIR}/cuda_twin/${name}/${_rel}")
      configure_file("${_abs}" "${_cu}" COPYONLY)
      list(APPEND _cu_sources "${_cu}")
    endforeach()
    if(PARALLAX_CUDA_TWINS_COMPILE_ONLY)
      add_library(${name}_cuda OBJECT ${_cu_sources})
      target_compile_options(${name}_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-cuda>)
    else()
      add_executable(${name}_cuda ${_cu_sources})
    endif()
    _parallax_configure_target(${name}_cuda)
    list(REMOVE_DUPLICATES _src_dirs)
    target_include_directories(${name}_cuda PRIVATE ${_src_dirs})
    if(ARG_LIBS)
      target_link_libraries(${name}_cuda PRIVATE ${ARG_LIBS})
    endif()
  endif()
endfunction()
