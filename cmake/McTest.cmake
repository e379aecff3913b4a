# mc_add_test(NAME name SOURCES a.cpp ... LIBS lib ... LABELS unit|e2e|rdma|cuda [TIMEOUT s])
# One GoogleTest executable registered with ctest through gtest_discover_tests, labelled by what it does:
#   unit  in-process only (may use loopback sockets and threads; starts no binary)
#   e2e   starts one of the project's binaries (or a script that does); add_dependencies on what it starts
#   rdma  needs an RDMA device (skips with the reason elsewhere); cuda: needs a GPU
#   fuzz  a fuzz harness's short bounded run over its seed corpus (mc_add_fuzz below; tests/fuzz/)
find_package(GTest REQUIRED)
include(GoogleTest)
# The test programs' own files (not the libraries they test) are compiled at -O0 in the sanitized build: they drive
# daemons and libraries built at -O1 and do little work themselves, and -O0 costs a third less compile time than -O1
# (tests/sched/faults_e2e_test.cpp: 34-36 -> 23 s CPU, GCC 12, 2026-12-05); the test files are about 60 % of the
# build. The precompiled header is built with the same flags, or GCC would refuse it.
set(MC_TEST_COMPILE_OPTIONS)
if(MC_SANITIZE AND NOT MC_FUZZ)
  set(MC_TEST_COMPILE_OPTIONS -O0)
endif()

# mc_test_pch: one precompiled header (GoogleTest, msgpack, ZeroMQ, JSON, CLI11) shared by every test program.
# Call mc_test_pch_target() once mc_net exists. A test whose flags differ simply falls back to the text.
function(mc_test_pch_target)
  file(WRITE ${CMAKE_BINARY_DIR}/mc_test_pch.cpp "// translation unit that owns the tests' precompiled header\n")
  add_library(mc_test_pch OBJECT ${CMAKE_BINARY_DIR}/mc_test_pch.cpp)
  target_link_libraries(mc_test_pch PRIVATE mc_net GTest::gtest GTest::gmock)
  target_compile_options(mc_test_pch PRIVATE ${MC_TEST_COMPILE_OPTIONS})
  target_compile_definitions(mc_test_pch PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_precompile_headers(mc_test_pch PRIVATE
    <gtest/gtest.h> <gmock/gmock.h> <msgpack.hpp> <zmq.hpp> <zmq_addon.hpp> <nlohmann/json.hpp> <CLI/CLI.hpp>
    <string> <vector> <map> <memory> <thread> <chrono>)
endfunction()

# SERIAL: each test of the program runs alone (ctest RUN_SERIAL): whole simulated clusters whose assertions about
# what the Conductor planned and the prefill did need the CPU they were sized for.
function(mc_add_test)
  cmake_parse_arguments(T "SERIAL" "NAME;TIMEOUT;LOCK" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  # Shared test helpers (child processes, protocol round trips): tests/support/mc/testkit/*.hpp
  target_include_directories(${T_NAME} PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
  target_compile_options(${T_NAME} PRIVATE ${MC_TEST_COMPILE_OPTIONS})
  target_compile_definitions(${T_NAME} PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(TARGET mc_test_pch)
    target_precompile_headers(${T_NAME} REUSE_FROM mc_test_pch)
  endif()
  set(T_SERIAL_PROP)
  if(T_SERIAL)
    set(T_SERIAL_PROP RUN_SERIAL TRUE)
  endif()
  if(T_LOCK)  # tests holding the same lock never run at once (ctest -j): e.g. "netns", the host's namespace list
    list(APPEND T_SERIAL_PROP RESOURCE_LOCK ${T_LOCK})
  endif()
  # The order of a run without timings of its own (a fresh clone: ctest -j starts the dearest COST first). The serial
  # tests first, each alone while nothing else is under way; then the chain of a lock (about 450 s of namespace tests
  # one after another) beside everything else, not after it with the other core idle (a tail of ~6 minutes in
  # declaration order). Nothing else is reordered: a COST by label that started the long cluster tests together
  # overloaded the machine (docs/BENCHMARKS.md "Build and test time").
  if(T_SERIAL)
    list(APPEND T_SERIAL_PROP COST 3000)
  elseif(T_LOCK)
    list(APPEND T_SERIAL_PROP COST 2000)
  endif()
  if("unit" IN_LIST T_LABELS)  # tools/run-tests.sh --quick builds only these (target mc_unit_tests)
    set_property(GLOBAL APPEND PROPERTY MC_UNIT_TEST_TARGETS ${T_NAME})
  endif()
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} ${T_SERIAL_PROP}
    DISCOVERY_TIMEOUT 60)
endfunction()

# mc_add_fuzz(NAME name SOURCES a.cpp ... LIBS lib ... [RUNS n] [SECONDS s])
# One libFuzzer harness (tests/fuzz/name.cpp defines LLVMFuzzerTestOneInput), its seeds in
# tests/fuzz/corpus/<name>/. Without MC_FUZZ it is linked with tests/fuzz/driver.cpp (the seeds, then
# deterministic mutations: RUNS executions or SECONDS, whichever comes first); with MC_FUZZ (clang) it is a
# real libFuzzer binary, run for the same bounds (new inputs go to the build tree, never to the checked-in
# corpus). Either way registered with ctest as <name>, label fuzz, timeout 60 s.
function(mc_add_fuzz)
  cmake_parse_arguments(F "" "NAME;RUNS;SECONDS" "SOURCES;LIBS" ${ARGN})
  if(NOT F_RUNS)
    set(F_RUNS 200000)
  endif()
  if(NOT F_SECONDS)
    set(F_SECONDS 8)
  endif()
  set(corpus ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${F_NAME})
  if(MC_FUZZ)
    add_executable(${F_NAME} ${F_SOURCES})
    target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer)
    set(new_inputs ${CMAKE_CURRENT_BINARY_DIR}/new-inputs/${F_NAME})
    file(MAKE_DIRECTORY ${new_inputs})
    add_test(NAME ${F_NAME} COMMAND ${F_NAME} -runs=${F_RUNS} -max_total_time=${F_SECONDS} ${new_inputs} ${corpus})
  else()
    add_executable(${F_NAME} ${F_SOURCES} ${CMAKE_SOURCE_DIR}/tests/fuzz/driver.cpp)
    add_test(NAME ${F_NAME} COMMAND ${F_NAME} --runs ${F_RUNS} --seconds ${F_SECONDS} ${corpus})
  endif()
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  # An allocation over 2 GiB is a failure, as libFuzzer's -malloc_limit_mb makes it: a decoder must not
  # allocate for what a few input bytes declare. Appended to the caller's ASAN_OPTIONS (tools/run-tests.sh).
  set_tests_properties(${F_NAME} PROPERTIES LABELS fuzz TIMEOUT 60
    ENVIRONMENT_MODIFICATION "ASAN_OPTIONS=string_append::max_allocation_size_mb=2048:allocator_may_return_null=0")
endfunction()
