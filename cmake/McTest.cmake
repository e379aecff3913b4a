# mc_add_test(NAME name SOURCES a.cpp ... LIBS lib ... LABELS label ... [TIMEOUT s] [SERIAL] [LOCK l] [GROUP g])
# One GoogleTest program (or, with GROUP, a part of a shared one) registered with ctest through gtest_discover_tests,
# labelled by what it does:
#   unit  in-process only (may use loopback sockets and threads; starts no binary)
#   e2e   starts one of the project's binaries (or a script that does); add_dependencies on what it starts
#   ha    the replicated master with etcd (skips with the reason without etcd); netns: network namespaces (root)
#   rdma  needs an RDMA device (skips with the reason elsewhere); cuda: needs a GPU
#   fuzz  a fuzz harness's short bounded run over its seed corpus (mc_add_fuzz below; tests/fuzz/)
# A program of several files is compiled in unity batches (MC_UNITY_BUILD): two of its files whose anonymous
# namespaces hold a helper of one name do not compile together there (only there: a plain build compiles file by
# file). New test files put their file-local helpers in `namespace MC_UNITY_ID { ... }` instead (unique per file in a
# batch, anonymous otherwise), as the e2e files of the GROUP programs do; the older unit-test files still use
# anonymous namespaces. A new e2e test joins its directory's GROUP.
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
  mc_test_unity_id(mc_test_pch)
  target_precompile_headers(mc_test_pch PRIVATE
    <gtest/gtest.h> <gmock/gmock.h> <msgpack.hpp> <zmq.hpp> <zmq_addon.hpp> <nlohmann/json.hpp> <CLI/CLI.hpp>
    <string> <vector> <map> <memory> <thread> <chrono>)
endfunction()

# mc_test_program(target): the settings every test program shares.
function(mc_test_program target)
  target_link_libraries(${target} PRIVATE GTest::gtest GTest::gmock GTest::gtest_main)
  # Shared test helpers (child processes, protocol round trips): tests/support/mc/testkit/*.hpp
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
  target_compile_options(${target} PRIVATE ${MC_TEST_COMPILE_OPTIONS})
  target_compile_definitions(${target} PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(TARGET mc_test_pch)
    target_precompile_headers(${target} REUSE_FROM mc_test_pch)
  endif()
  mc_test_unity_id(${target})
endfunction()

# MC_UNITY_ID: what a test file of a GROUP program names its file-local namespace (`namespace MC_UNITY_ID {`): in a
# unity batch CMake defines it uniquely per file (UNITY_BUILD_UNIQUE_ID), so two files' helpers of one name never
# meet; file by file it is empty, an anonymous namespace.
function(mc_test_unity_id target)
  if(MC_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD_UNIQUE_ID MC_UNITY_ID)
  else()
    target_compile_definitions(${target} PRIVATE MC_UNITY_ID=)
  endif()
endfunction()

# mc_test_suites(var group file ...): the GoogleTest suites the files define (TEST, TEST_F at the start of a line), as
# a --gtest_filter expression "SuiteA.*:SuiteB.*", for a program of GROUP `group`. Refused at configure time, since
# each would register tests silently wrong: a suite named through a macro (all capitals: the filter would name the
# macro), TEST_P / TYPED_TEST (their names carry a prefix or a parameter), and a suite another program of the group
# already has (its tests would be registered twice, with the last program's properties).
function(mc_test_suites var group)
  set(suites)
  get_property(taken GLOBAL PROPERTY MC_GROUP_SUITES_${group})
  foreach(src ${ARGN})
    file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/${src} other REGEX "^(TEST_P|TYPED_TEST|TYPED_TEST_P)\\(")
    if(other)
      message(FATAL_ERROR "mc_add_test: ${src} has parameterized or typed tests, which a GROUP cannot filter by suite: "
                          "leave its program out of GROUP ${group}")
    endif()
    file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/${src} lines REGEX "^TEST(_F)?\\([A-Za-z0-9_]+,")
    foreach(line ${lines})
      string(REGEX REPLACE "^TEST(_F)?\\(([A-Za-z0-9_]+),.*" "\\2" suite "${line}")
      if(suite MATCHES "^[A-Z0-9_]+$")
        message(FATAL_ERROR "mc_add_test: ${src} names the suite ${suite}, a macro by its look: a GROUP registers "
                            "tests by their literal suite names; write the name, or leave the program out of GROUP")
      endif()
      if(suite IN_LIST taken)
        message(FATAL_ERROR "mc_add_test: suite ${suite} of ${src} is already used by another program of GROUP "
                            "${group}: suite names must be unique in a group")
      endif()
      list(APPEND suites ${suite})
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES suites)
  if(NOT suites)
    message(FATAL_ERROR "mc_add_test: no TEST or TEST_F suite found in ${ARGN}")
  endif()
  set_property(GLOBAL APPEND PROPERTY MC_GROUP_SUITES_${group} ${suites})
  list(TRANSFORM suites APPEND ".*")
  list(JOIN suites ":" filter)
  set(${var} ${filter} PARENT_SCOPE)
endfunction()

# SERIAL: each test of the program runs alone (ctest RUN_SERIAL): whole simulated clusters whose assertions about
# what the Conductor planned and the prefill did need the CPU they were sized for.
# GROUP g: the sources are compiled into the directory's shared program g instead of a program of their own (one
# link, and unity batches across the files: a single test file costs about 8 s of compiler time on its own and about
# 2 s in a batch); the tests keep their labels and properties, registered from g through a filter on their suites.
# NAME is then a utility target, so that add_dependencies(NAME ...) still orders the binaries the tests start.
function(mc_add_test)
  cmake_parse_arguments(T "SERIAL" "NAME;TIMEOUT;LOCK;GROUP" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set(T_FILTER)
  if(T_GROUP)
    if(NOT TARGET ${T_GROUP})
      add_executable(${T_GROUP})
      mc_test_program(${T_GROUP})
    endif()
    target_sources(${T_GROUP} PRIVATE ${T_SOURCES})
    target_link_libraries(${T_GROUP} PRIVATE ${T_LIBS})
    add_custom_target(${T_NAME})
    add_dependencies(${T_GROUP} ${T_NAME})
    mc_test_suites(suites ${T_GROUP} ${T_SOURCES})
    set(T_FILTER TEST_FILTER ${suites})
    set(T_TARGET ${T_GROUP})
  else()
    add_executable(${T_NAME} ${T_SOURCES})
    target_link_libraries(${T_NAME} PRIVATE ${T_LIBS})
    mc_test_program(${T_NAME})
    set(T_TARGET ${T_NAME})
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
    set_property(GLOBAL APPEND PROPERTY MC_UNIT_TEST_TARGETS ${T_TARGET})
  endif()
  gtest_discover_tests(${T_TARGET} ${T_FILTER}
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
