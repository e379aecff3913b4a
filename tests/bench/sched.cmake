# Conductor decision time (issue 6): docs/BENCHMARKS.md, "Conductor decisions".
add_executable(sched_decision_bench ${CMAKE_CURRENT_LIST_DIR}/sched_decision_bench.cpp)
target_link_libraries(sched_decision_bench PRIVATE mc_sched benchmark::benchmark)
set_target_properties(sched_decision_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
