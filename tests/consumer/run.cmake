# ctest test_install_consumer: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DGENERATOR=... -DCXX=... -P run.cmake
string(RANDOM LENGTH 8 suffix)
set(root "$ENV{TMPDIR}")
if(NOT root)
  set(root /tmp)
endif()
set(prefix "${root}/cachealloc-consumer-${suffix}/prefix")
set(build "${root}/cachealloc-consumer-${suffix}/build")

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "failed (${status}): ${ARGV}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
# What a package user expects to find.
include(GNUInstallDirs)
foreach(file IN ITEMS
    bin/cachealloc-analyze bin/cachealloc-conformance bin/cachealloc-seed-example bin/cachealloc-synthetic
    ${CMAKE_INSTALL_LIBDIR}/libcachealloc.so
    include/cachealloc/history.hpp include/cachealloc/analyzer/reports.hpp include/cachealloc/snapshot/model.hpp
    ${CMAKE_INSTALL_LIBDIR}/cmake/cachealloc/cachealloc-config.cmake
    share/man/man1/cachealloc-analyze.1 share/man/man1/cachealloc-synthetic.1
    share/bash-completion/completions/cachealloc-analyze)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "not installed: ${file}")
  endif()
endforeach()
file(READ ${prefix}/${CMAKE_INSTALL_LIBDIR}/cmake/cachealloc/cachealloc-targets.cmake targets)
if(targets MATCHES "cachealloc_warnings")
  message(FATAL_ERROR "the installed package exports the internal warnings target")
endif()
if(NOT targets MATCHES "cxx_std_20")
  message(FATAL_ERROR "the installed targets do not carry cxx_std_20")
endif()

# No CMAKE_CXX_STANDARD: the targets must bring C++20.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${build} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${build})
run(${build}/consumer ${build}/consumer.bin)
message(STATUS "${last_output}")
if(NOT last_output MATCHES "^consumer: [1-9][0-9]* events, report summary")
  message(FATAL_ERROR "unexpected output: ${last_output}")
endif()
run(${prefix}/bin/cachealloc-analyze ${build}/consumer.bin)
file(REMOVE_RECURSE "${root}/cachealloc-consumer-${suffix}")
