# moeserve_layer(NAME DEPS <libs...>)
# One static library per architectural layer, built from every .cpp in the
# folder (and its sub-folders). Files whose name ends in _avx2.cpp or
# _avx512.cpp are compiled with that instruction set enabled; they are only
# ever called after a run-time CPUID check (see src/kernels/cpu/dispatch.cpp).
function(moeserve_layer name)
  cmake_parse_arguments(ARG "" "" "DEPS;EXCLUDE" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  foreach(ex IN LISTS ARG_EXCLUDE)
    list(FILTER sources EXCLUDE REGEX "${ex}")
  endforeach()
  add_library(moeserve_${name} STATIC ${sources})
  add_library(moeserve::${name} ALIAS moeserve_${name})
  target_include_directories(moeserve_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(moeserve_${name} PUBLIC ${ARG_DEPS})
  moeserve_warnings(moeserve_${name})
  moeserve_simd_flags(${sources})
endfunction()

function(moeserve_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
endfunction()

function(moeserve_simd_flags)
  foreach(src IN LISTS ARGN)
    # (Other target options than a precompiled header's: these skip it.)
    if(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2"
        SKIP_PRECOMPILE_HEADERS ON)
    elseif(src MATCHES "_vbmi_avx512\\.cpp$")  # (registered only where CPUID shows VBMI)
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx2;-mfma;-mf16c;-mbmi2;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512vbmi;-mavx512bitalg"
        SKIP_PRECOMPILE_HEADERS ON)
    elseif(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx2;-mfma;-mf16c;-mbmi2;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni"
        SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

# moeserve_test(NAME DEPS <libs...>): one gtest binary per test folder.
function(moeserve_test name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  if(NOT sources)
    return()
  endif()
  add_executable(test_${name} ${sources})
  target_link_libraries(test_${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(test_${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(test_${name} PRIVATE
    MOESERVE_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  moeserve_warnings(test_${name})
  moeserve_simd_flags(${sources})
  moeserve_test_build_flags(test_${name})
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
endfunction()

# Test binaries compile faster than they run: the code under test is in the
# layers (built with the build type's flags); the tests' own code is checks
# and references, so a Release build compiles it at -O1 (a third less
# compile time than -O3 on CI's two cores), and every test target
# precompiles the heavy headers it shares (gtest, nlohmann/json, fmt).
function(moeserve_test_build_flags target)
  target_compile_options(${target} PRIVATE $<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O1>)
  if(MOESERVE_TEST_PCH)
    target_precompile_headers(${target} PRIVATE <gtest/gtest.h> <nlohmann/json.hpp> <fmt/format.h>
      <string> <vector> <memory> <cstdint>)
  endif()
endfunction()
