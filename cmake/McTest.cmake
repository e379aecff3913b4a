# mc_add_test(NAME name SOURCES a.cpp ... LIBS lib ... LABELS unit|e2e|rdma|cuda [TIMEOUT s])
# One GoogleTest executable registered with ctest through gtest_discover_tests, labelled by what it does:
#   unit  in-process only (may use loopback sockets and threads; starts no binary)
#   e2e   starts one of the project's binaries (or a script that does); add_dependencies on what it starts
#   rdma  needs an RDMA device (skips with the reason elsewhere); cuda: needs a GPU
find_package(GTest REQUIRED)
include(GoogleTest)
# mc_test_pch: one precompiled header (GoogleTest, msgpack, ZeroMQ, JSON, CLI11) shared by every test
# program; compiling these headers once instead of once per test file roughly halves the test build.
# Call mc_test_pch_target() once mc_common exists. A test whose flags differ simply falls back to the text.
function(mc_test_pch_target)
  file(WRITE ${CMAKE_BINARY_DIR}/mc_test_pch.cpp "// translation unit that owns the tests' precompiled header\n")
  add_library(mc_test_pch OBJECT ${CMAKE_BINARY_DIR}/mc_test_pch.cpp)
  target_link_libraries(mc_test_pch PRIVATE mc_common GTest::gtest GTest::gmock)
  target_compile_definitions(mc_test_pch PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_precompile_headers(mc_test_pch PRIVATE
    <gtest/gtest.h> <gmock/gmock.h> <msgpack.hpp> <zmq.hpp> <zmq_addon.hpp> <nlohmann/json.hpp> <CLI/CLI.hpp>
    <string> <vector> <map> <memory> <thread> <chrono>)
endfunction()

function(mc_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  # Shared test helpers (child processes, protocol round trips): tests/support/mc/testkit/*.hpp
  target_include_directories(${T_NAME} PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
  target_compile_definitions(${T_NAME} PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(TARGET mc_test_pch)
    target_precompile_headers(${T_NAME} REUSE_FROM mc_test_pch)
  endif()
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
