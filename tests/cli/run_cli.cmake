# One CLI test (tests/CMakeLists.txt): runs CLI with ARGS (one string, split like a shell command
# line) and checks its exit status against EXPECT_RC and its stdout and stderr against
# EXPECT_REGEX (a CMake regular expression).
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${CLI}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "fusedattn ${ARGS}: exit status ${rc}, expected ${EXPECT_RC}\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "fusedattn ${ARGS}: output does not match '${EXPECT_REGEX}'\n${out}${err}")
endif()
message(STATUS "${out}${err}")
