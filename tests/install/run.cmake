# ctest install.find_package (tests/CMakeLists.txt): installs the built library (component
# Unspecified: the library, headers and package config) into WORK/prefix, configures and builds
# tests/install/ there against it with the same compiler, and runs the consumer.
file(REMOVE_RECURSE ${WORK})
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${WORK}/prefix;--component;Unspecified"
    "${CMAKE_COMMAND};-S;${SOURCE};-B;${WORK}/build;-DCMAKE_PREFIX_PATH=${WORK}/prefix;-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_BUILD_TYPE=Release;${EXTRA}"
    "${CMAKE_COMMAND};--build;${WORK}/build"
    "${WORK}/build/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step}: exit status ${rc}\n${out}${err}")
  endif()
endforeach()
message(STATUS "${out}")
