# test_browser_report: opens every testdata/ report in Debian's headless
# Chromium through puppeteer-core (report_test.cjs says what it checks).
# puppeteer-core and ajv come from the npm registry at the versions
# package-lock.json pins, installed once per build folder at configure time
# into <build>/tests/browser-npm/; puppeteer never downloads a browser.
# The sanitizer builds turn it off (./dev.sh passes -DCACHEALLOC_BROWSER_TESTS=OFF):
# the page script is the same, only the analyzer is instrumented.
option(CACHEALLOC_BROWSER_TESTS "Open the HTML reports in headless Chromium (needs chromium, node, npm)" ON)
if(NOT CACHEALLOC_BROWSER_TESTS)
  return()
endif()
find_program(CACHEALLOC_CHROMIUM NAMES chromium chromium-browser)
find_program(CACHEALLOC_NODE node)
find_program(CACHEALLOC_NPM npm)
if(NOT CACHEALLOC_CHROMIUM OR NOT CACHEALLOC_NODE OR NOT CACHEALLOC_NPM)
  message(WARNING "test_browser_report left out: it needs chromium, node and npm (./dev.sh installs them)")
  return()
endif()
set(_browser_src ${CMAKE_CURRENT_SOURCE_DIR}/browser)
set(_browser_npm ${CMAKE_CURRENT_BINARY_DIR}/browser-npm)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_browser_src}/package-lock.json)
file(SHA256 ${_browser_src}/package-lock.json _browser_lock)
if(NOT EXISTS ${_browser_npm}/installed-${_browser_lock})
  file(REMOVE_RECURSE ${_browser_npm})
  file(MAKE_DIRECTORY ${_browser_npm})
  file(COPY ${_browser_src}/package.json ${_browser_src}/package-lock.json DESTINATION ${_browser_npm})
  message(STATUS "npm ci (puppeteer-core, ajv for test_browser_report) in ${_browser_npm}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PUPPETEER_SKIP_DOWNLOAD=1
                          ${CACHEALLOC_NPM} ci --no-audit --no-fund --ignore-scripts
                  WORKING_DIRECTORY ${_browser_npm} RESULT_VARIABLE _browser_npm_result)
  if(NOT _browser_npm_result EQUAL 0)
    message(FATAL_ERROR "npm ci in ${_browser_npm} failed (${_browser_npm_result}); "
                        "-DCACHEALLOC_BROWSER_TESTS=OFF builds without the browser test")
  endif()
  file(TOUCH ${_browser_npm}/installed-${_browser_lock})
endif()
add_test(NAME test_browser_report
         COMMAND ${CACHEALLOC_NODE} ${_browser_src}/report_test.cjs $<TARGET_FILE:cachealloc-analyze>
                 ${PROJECT_SOURCE_DIR}/testdata ${CMAKE_CURRENT_BINARY_DIR}/browser-out ${_browser_npm}/node_modules
                 ${CACHEALLOC_CHROMIUM})
set_tests_properties(test_browser_report PROPERTIES TIMEOUT 900)
