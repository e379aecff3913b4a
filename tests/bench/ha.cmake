# Failover of the replicated store master (issue 21): docs/RELIABILITY.md "Master failover", run by
# tests/bench/ha_bench.sh. A GoogleTest program for its fixtures (a real etcd), never registered with ctest.
if(NOT TARGET GTest::gtest)
  return()
endif()
add_executable(ha_failover_bench ${CMAKE_CURRENT_LIST_DIR}/ha_failover_bench.cpp)
target_link_libraries(ha_failover_bench PRIVATE mc_store mc_transfer mc_net GTest::gtest GTest::gtest_main)
target_include_directories(ha_failover_bench PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
target_compile_definitions(ha_failover_bench PRIVATE MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_target_properties(ha_failover_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
add_dependencies(ha_failover_bench mc-store)
