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
    if(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
    elseif(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx2;-mfma;-mf16c;-mbmi2;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni")
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
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
endfunction()
