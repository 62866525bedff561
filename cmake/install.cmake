# What `cmake --install` puts where, and the ctest that builds a program
# against the installed package (tests/consumer).
include(CMakePackageConfigHelpers)

# Consumers get C++20 from the targets themselves: our headers need it, and
# g++ 12 defaults to C++17.
foreach(library IN ITEMS cachealloc_allocator_types cachealloc_snapshot cachealloc_allocator cachealloc_history
                        cachealloc_recorder cachealloc_analyzer)
  target_compile_features(${library} INTERFACE cxx_std_20)
endforeach()

set(CACHEALLOC_EXECUTABLES cachealloc-analyze cachealloc-conformance cachealloc-seed-example cachealloc-synthetic)

# The libraries, exported for find_package(cachealloc). The warnings target
# stays ours: every library takes it as $<BUILD_INTERFACE:...> only.
install(TARGETS cachealloc_allocator_types cachealloc_snapshot cachealloc_allocator cachealloc_history
                cachealloc_recorder cachealloc_analyzer
        EXPORT cachealloc-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# libcachealloc.so (the C ABI, for ctypes and PyTorch's CUDAPluggableAllocator) and the tools.
install(TARGETS cachealloc_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Python frames for libcachealloc.so's recordings (python/src/python_install.cpp),
# where Python's headers were found.
if(TARGET cachealloc_python)
  install(TARGETS cachealloc_python LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(TARGETS ${CACHEALLOC_EXECUTABLES} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY recorder/allocator/types/ recorder/allocator/include/ recorder/history/include/ snapshot/include/
                  analyzer/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT cachealloc-targets NAMESPACE cachealloc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachealloc)
configure_package_config_file(cmake/cachealloc-config.cmake.in
  ${PROJECT_BINARY_DIR}/cachealloc-config.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachealloc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cachealloc-config-version.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cachealloc-config.cmake ${PROJECT_BINARY_DIR}/cachealloc-config-version.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cachealloc)

# Bash completions: one script, loaded by bash-completion under each name.
foreach(program IN LISTS CACHEALLOC_EXECUTABLES)
  install(FILES cli/completions/cachealloc.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME ${program})
endforeach()

# Man pages, made from each tool's --help and --version by help2man at build
# time (Debian's help2man), so they never disagree with the tools.
find_program(CACHEALLOC_HELP2MAN help2man)
option(CACHEALLOC_MAN_PAGES "Generate man pages with help2man" ON)
if(CACHEALLOC_MAN_PAGES AND CACHEALLOC_HELP2MAN)
  set(pages)
  set(summary_cachealloc-analyze "explain a GPU caching-allocator memory snapshot")
  set(summary_cachealloc-conformance "replay PyTorch allocator sequences and compare every figure")
  set(summary_cachealloc-seed-example "PyTorch's four-step allocator example on cachealloc")
  set(summary_cachealloc-synthetic "record a synthetic training loop's memory history")
  foreach(program IN LISTS CACHEALLOC_EXECUTABLES)
    set(page ${PROJECT_BINARY_DIR}/man/${program}.1)
    add_custom_command(OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${CACHEALLOC_HELP2MAN} --no-info --no-discard-stderr --section=1 "--name=${summary_${program}}"
              --output=${page} $<TARGET_FILE:${program}>
      DEPENDS ${program}
      COMMENT "man page of ${program}"
      VERBATIM)
    list(APPEND pages ${page})
  endforeach()
  add_custom_target(cachealloc_man_pages ALL DEPENDS ${pages})
  install(FILES ${pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
elseif(CACHEALLOC_MAN_PAGES)
  message(STATUS "cachealloc: help2man not found, no man pages (Debian: apt install help2man)")
endif()

# The consumer test: install into a temporary prefix, then configure and
# build tests/consumer against it with no C++ standard set, and run it.
# Not in sanitizer builds: the consumer links the installed (instrumented)
# libraries without the sanitizer's runtime, which is no user's case.
if(CACHEALLOC_BUILD_TESTS AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  add_test(NAME test_install_consumer
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   -DGENERATOR=${CMAKE_GENERATOR} -DCXX=${CMAKE_CXX_COMPILER}
                   -P ${PROJECT_SOURCE_DIR}/tests/consumer/run.cmake)
  set_tests_properties(test_install_consumer PROPERTIES TIMEOUT 900)
endif()
