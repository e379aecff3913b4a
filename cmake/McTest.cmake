# mc_add_test(NAME name SOURCES a.cpp ... LIBS lib ... LABELS unit|e2e|rdma|cuda [TIMEOUT s])
# One GoogleTest executable registered with ctest through gtest_discover_tests, labelled.
find_package(GTest REQUIRED)
include(GoogleTest)
function(mc_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE
    MC_BINARY_DIR="${CMAKE_BINARY_DIR}" MC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
