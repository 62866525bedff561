# The HTML report's assets, inlined into cachealloc::analyzer at build time:
# uPlot (the charting library, from the npm registry at the version that
# package-lock.json pins; nothing is vendored into git) and our own page
# script and style. `npm ci` runs once per build folder, at configure time,
# into <build>/report-npm/. Offline: -DCACHEALLOC_UPLOT_DIR=<a folder holding
# uPlot.iife.min.js and uPlot.min.css> instead.
set(CACHEALLOC_UPLOT_DIR "" CACHE PATH "uPlot's dist/ folder; empty: npm ci from analyzer/html/package-lock.json")
set(_report_dir ${CMAKE_CURRENT_SOURCE_DIR}/html)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_report_dir}/package-lock.json)
if(CACHEALLOC_UPLOT_DIR)
  set(_uplot_dist ${CACHEALLOC_UPLOT_DIR})
else()
  set(_npm_dir ${CMAKE_CURRENT_BINARY_DIR}/report-npm)
  set(_uplot_dist ${_npm_dir}/node_modules/uplot/dist)
  file(SHA256 ${_report_dir}/package-lock.json _lock_hash)
  set(_stamp ${_npm_dir}/installed-${_lock_hash})
  if(NOT EXISTS ${_stamp})
    find_program(CACHEALLOC_NPM npm)
    if(NOT CACHEALLOC_NPM)
      message(FATAL_ERROR "the HTML report needs uPlot: install npm (./dev.sh does), or pass "
                          "-DCACHEALLOC_UPLOT_DIR=<folder with uPlot.iife.min.js and uPlot.min.css>")
    endif()
    file(REMOVE_RECURSE ${_npm_dir})
    file(MAKE_DIRECTORY ${_npm_dir})
    file(COPY ${_report_dir}/package.json ${_report_dir}/package-lock.json DESTINATION ${_npm_dir})
    message(STATUS "npm ci (uPlot for the HTML report) in ${_npm_dir}")
    execute_process(COMMAND ${CACHEALLOC_NPM} ci --no-audit --no-fund --ignore-scripts
                    WORKING_DIRECTORY ${_npm_dir} RESULT_VARIABLE _npm_result)
    if(NOT _npm_result EQUAL 0)
      message(FATAL_ERROR "npm ci in ${_npm_dir} failed (${_npm_result}); offline, pass -DCACHEALLOC_UPLOT_DIR")
    endif()
    file(TOUCH ${_stamp})
  endif()
endif()
foreach(_file uPlot.iife.min.js uPlot.min.css)
  if(NOT EXISTS ${_uplot_dist}/${_file})
    message(FATAL_ERROR "${_uplot_dist}/${_file} is missing")
  endif()
endforeach()
set(_assets_cpp ${CMAKE_CURRENT_BINARY_DIR}/generated/html_assets.cpp)
set(_assets
  kUplotJs=${_uplot_dist}/uPlot.iife.min.js
  kUplotCss=${_uplot_dist}/uPlot.min.css
  kReportJs=${_report_dir}/report.js
  kReportCss=${_report_dir}/report.css)
set(_asset_files)
foreach(_asset IN LISTS _assets)
  string(REGEX REPLACE "^[^=]*=" "" _path ${_asset})
  list(APPEND _asset_files ${_path})
endforeach()
string(REPLACE ";" "|" _assets_arg "${_assets}")
add_custom_command(OUTPUT ${_assets_cpp}
  COMMAND ${CMAKE_COMMAND} "-DASSETS=${_assets_arg}" -DOUTPUT=${_assets_cpp} -P ${_report_dir}/embed.cmake
  DEPENDS ${_asset_files} ${_report_dir}/embed.cmake
  COMMENT "Inlining uPlot and the report's script into html_assets.cpp"
  VERBATIM)
target_sources(cachealloc_analyzer PRIVATE ${_assets_cpp})
