# mc-gateway's limit: cpp-httplib answering a fixed response (tests/bench/gateway_bench.sh).
add_executable(http_fixed_server ${CMAKE_CURRENT_SOURCE_DIR}/http_fixed_server.cpp)
target_link_libraries(http_fixed_server PRIVATE mc_net PkgConfig::HTTPLIB Threads::Threads)
set_target_properties(http_fixed_server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
