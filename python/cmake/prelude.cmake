# Included right after project(flashkda) when the package is built by pip
# (pyproject.toml sets CMAKE_PROJECT_flashkda_INCLUDE to this file), i.e. before
# CMakeLists.txt defines FLASHKDA_CUTLASS_INCLUDE_DIR and checks it.
#
# Its one job: make `pip install .` work on a fresh clone with CUDA on, where
# scripts/setup_deps.sh has not been run. The CUTLASS/CuTe headers are taken from,
# in order:
#   1. -DFLASHKDA_CUTLASS_INCLUDE_DIR=... (or -C cmake.define...) given by the user;
#   2. third_party/ as installed by scripts/setup_deps.sh;
#   3. an importable `cutlass_library` package (nvidia-cutlass) in the build's Python;
#   4. nvidia-cutlass==4.2.0.0 (the pinned version) pip-installed, headers only
#      (--no-deps), into the build directory.
# Without CUDA nothing is looked up. A failure stops the build with the fix in the message.

set(_flashkda_cutlass_version 4.2.0.0)
set(_flashkda_default_inc
    "${CMAKE_CURRENT_SOURCE_DIR}/third_party/nvidia-cutlass-${_flashkda_cutlass_version}/cutlass_library/source/include")

# Will CMakeLists.txt enable CUDA? Same rule: nvcc found, unless FLASHKDA_ENABLE_CUDA=OFF.
include(CheckLanguage)
check_language(CUDA)
set(_flashkda_cuda OFF)
if(DEFINED FLASHKDA_ENABLE_CUDA)
  set(_flashkda_cuda ${FLASHKDA_ENABLE_CUDA})
elseif(CMAKE_CUDA_COMPILER)
  set(_flashkda_cuda ON)
endif()

if(_flashkda_cuda AND NOT DEFINED FLASHKDA_CUTLASS_INCLUDE_DIR AND NOT EXISTS "${_flashkda_default_inc}/cute/tensor.hpp")
  set(_flashkda_py "${Python_EXECUTABLE}")
  if(NOT _flashkda_py)
    find_program(_flashkda_py NAMES python3 python)
  endif()
  set(_flashkda_find [=[
import importlib.util, os, sys
spec = importlib.util.find_spec("cutlass_library")
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
for root in spec.submodule_search_locations:
    inc = os.path.join(root, "source", "include")
    if os.path.isfile(os.path.join(inc, "cute", "tensor.hpp")):
        print(inc)
        sys.exit(0)
sys.exit(1)
]=])
  execute_process(COMMAND "${_flashkda_py}" -c "${_flashkda_find}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    set(_dest "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass-${_flashkda_cutlass_version}")
    set(_inc "${_dest}/cutlass_library/source/include")
    if(NOT EXISTS "${_inc}/cute/tensor.hpp")
      message(STATUS "flash_kda: fetching the CUTLASS headers (nvidia-cutlass==${_flashkda_cutlass_version}, --no-deps) into ${_dest}")
      # pip may be missing from an isolated build environment: fall back to python3's.
      execute_process(COMMAND "${_flashkda_py}" -m pip --version RESULT_VARIABLE _pip_rc OUTPUT_QUIET ERROR_QUIET)
      set(_pip_py "${_flashkda_py}")
      if(NOT _pip_rc EQUAL 0)
        find_program(_flashkda_sys_py NAMES python3 python)
        set(_pip_py "${_flashkda_sys_py}")
      endif()
      execute_process(
        COMMAND "${_pip_py}" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile
                --target "${_dest}" "nvidia-cutlass==${_flashkda_cutlass_version}"
        RESULT_VARIABLE _rc)
    endif()
    if(NOT EXISTS "${_inc}/cute/tensor.hpp")
      message(FATAL_ERROR
        "flash_kda: the CUDA build needs the CUTLASS/CuTe headers (nvidia-cutlass==${_flashkda_cutlass_version}) "
        "and they could not be found or fetched. Run scripts/setup_deps.sh first, or pass "
        "-C cmake.define.FLASHKDA_CUTLASS_INCLUDE_DIR=<cutlass>/include, or build CPU-only with "
        "-C cmake.define.FLASHKDA_ENABLE_CUDA=OFF.")
    endif()
  endif()
  message(STATUS "flash_kda: CUTLASS include dir: ${_inc}")
  set(FLASHKDA_CUTLASS_INCLUDE_DIR "${_inc}" CACHE PATH "CUTLASS/CuTe include dir (found by python/cmake/prelude.cmake)")
endif()
