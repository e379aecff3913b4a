# The policy library's promise (sched/policy/CMakeLists.txt): no sockets, no threads, no real clock.
# Run as `cmake -DPOLICY_DIR=<sched/policy> -P policy_purity.cmake` (ctest: sched_policy_purity); fails
# naming the file and the line that includes or uses one of them.
file(GLOB_RECURSE sources ${POLICY_DIR}/*.cpp ${POLICY_DIR}/*.hpp)
if(NOT sources)
  message(FATAL_ERROR "policy_purity: no sources under '${POLICY_DIR}' (pass -DPOLICY_DIR=<repo>/sched/policy)")
endif()
set(forbidden
  "#include <(thread|mutex|shared_mutex|condition_variable|future|stop_token|chrono|sys/socket\\.h|netinet/[a-z]+\\.h)>"
  "#include [<\"](zmq|zmq_addon)\\.hpp[>\"]"
  "#include \"mc/(net|coord|cli)/"
  "#include \"mc/common/daemon\\.hpp\""
  "std::(thread|jthread|mutex|async)[^a-z_]"
  "(steady_clock|system_clock|high_resolution_clock|RealClock)"
  "(usleep|nanosleep|sleep_for|sleep_until)\\(")
set(failures "")
foreach(src ${sources})
  file(STRINGS ${src} lines)
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    foreach(pattern ${forbidden})
      if(line MATCHES "${pattern}")
        string(APPEND failures "\n  ${src}:${n}: ${line}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(failures)
  message(FATAL_ERROR "policy_purity: mc_sched must use no sockets, threads or real clock (time comes from the "
                      "injected mc::Clock; the daemon belongs in sched/conductor/):${failures}")
endif()
list(LENGTH sources count)
message(STATUS "policy_purity: ${count} files under ${POLICY_DIR}: no sockets, threads or real clock")
