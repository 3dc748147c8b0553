# The layer rule of docs/design.md, section "1. Layers": every header of
# include/parallax belongs to one layer of the table there, includes only
# headers of its own layer or below, and no header reaches itself through
# its includes. The table in the docs is read as the rule, so the docs and
# the code cannot drift apart.
#
#   cmake -DROOT=<source dir> -P tests/headers/layers.cmake
cmake_minimum_required(VERSION 3.21)
if(NOT ROOT)
  message(FATAL_ERROR "layers.cmake: pass -DROOT=<source dir>")
endif()

# ---------------------------------------------------------------- the table
file(STRINGS "${ROOT}/docs/design.md" _lines)
set(_in_section FALSE)
set(_entries)  # "<layer>|<entry>"
foreach(_line IN LISTS _lines)
  if(_line MATCHES "^## ")
    if(_line MATCHES "^## 1\\. Layers")
      set(_in_section TRUE)
    else()
      set(_in_section FALSE)
    endif()
    continue()
  endif()
  if(NOT _in_section OR NOT _line MATCHES "^\\| *([0-9]+) *\\|[^|]*\\|([^|]*)\\|")
    continue()
  endif()
  set(_layer "${CMAKE_MATCH_1}")
  string(REGEX MATCHALL "`[^`]+`" _ticks "${CMAKE_MATCH_2}")
  foreach(_t IN LISTS _ticks)
    string(REPLACE "`" "" _t "${_t}")
    list(APPEND _entries "${_layer}|${_t}")
  endforeach()
endforeach()
list(LENGTH _entries _count)
if(_count EQUAL 0)
  message(FATAL_ERROR "docs/design.md has no layer table in section \"1. Layers\"")
endif()
# nn/ (parallax::nn: matrix products and a dense layer over Variables, for
# users without a framework of their own) is optional and outside the
# library's own layering: it sits with the model (layer 4) and nothing of
# the library includes it. trainers.hpp (the extern declarations of
# parallax::trainers) sits with the umbrella it includes (layer 7). Listed
# here until the table names them.
list(APPEND _entries "4|nn/" "7|trainers.hpp")

# The layer of a header (path below include/parallax): the longest entry
# that names it (a file, or a folder ending in /).
function(layer_of header out)
  set(_best -1)
  set(_best_len -1)
  foreach(_e IN LISTS _entries)
    string(FIND "${_e}" "|" _bar)
    string(SUBSTRING "${_e}" 0 ${_bar} _layer)
    math(EXPR _from "${_bar} + 1")
    string(SUBSTRING "${_e}" ${_from} -1 _path)
    string(LENGTH "${_path}" _len)
    set(_hit FALSE)
    if(_path MATCHES "/$")
      string(FIND "${header}" "${_path}" _at)
      if(_at EQUAL 0)
        set(_hit TRUE)
      endif()
    elseif(header STREQUAL _path)
      set(_hit TRUE)
    endif()
    if(_hit AND _len GREATER _best_len)
      set(_best ${_layer})
      set(_best_len ${_len})
    endif()
  endforeach()
  set(${out} ${_best} PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------- the headers
file(GLOB_RECURSE _headers RELATIVE "${ROOT}/include/parallax" "${ROOT}/include/parallax/*.hpp"
     "${ROOT}/include/parallax/*.cuh")
list(SORT _headers)
set(_problems)
foreach(_h IN LISTS _headers)
  layer_of("${_h}" _mine)
  if(_mine EQUAL -1)
    list(APPEND _problems "${_h} is in no layer of the table in docs/design.md")
    continue()
  endif()
  file(STRINGS "${ROOT}/include/parallax/${_h}" _incs REGEX "^[ \t]*#[ \t]*include[ \t]*<parallax/[^>]+>")
  set(_deps)
  foreach(_i IN LISTS _incs)
    string(REGEX REPLACE ".*<parallax/([^>]+)>.*" "\\1" _dep "${_i}")
    list(APPEND _deps "${_dep}")
    layer_of("${_dep}" _theirs)
    if(_theirs EQUAL -1)
      list(APPEND _problems "${_h} includes ${_dep}, which is in no layer of the table in docs/design.md")
    elseif(_theirs GREATER _mine)
      list(APPEND _problems "${_h} (layer ${_mine}) includes ${_dep} (layer ${_theirs}), a higher layer")
    endif()
  endforeach()
  string(MAKE_C_IDENTIFIER "${_h}" _id)
  set(_deps_${_id} "${_deps}")
endforeach()

# ---------------------------------------------------------------- cycles
# Depth-first search; a header met again while on the current path closes a
# cycle. States: unset (new), 1 (on the path), 2 (done).
function(visit header path)
  string(MAKE_C_IDENTIFIER "${header}" _id)
  get_property(_state GLOBAL PROPERTY "px_state_${_id}")
  if(_state STREQUAL "1")
    list(FIND path "${header}" _start)
    list(SUBLIST path ${_start} -1 _loop)
    list(APPEND _loop "${header}")
    list(JOIN _loop " -> " _cycle)
    set_property(GLOBAL APPEND PROPERTY px_cycles "include cycle: ${_cycle}")
    return()
  elseif(_state STREQUAL "2")
    return()
  endif()
  set_property(GLOBAL PROPERTY "px_state_${_id}" 1)
  list(APPEND path "${header}")
  foreach(_d IN LISTS _deps_${_id})
    visit("${_d}" "${path}")
  endforeach()
  set_property(GLOBAL PROPERTY "px_state_${_id}" 2)
endfunction()
foreach(_h IN LISTS _headers)
  visit("${_h}" "")
endforeach()
get_property(_cycles GLOBAL PROPERTY px_cycles)
list(APPEND _problems ${_cycles})

list(LENGTH _headers _n)
if(_problems)
  list(JOIN _problems "\n  " _text)
  message(FATAL_ERROR "the layer rule of docs/design.md is broken:\n  ${_text}")
endif()
message(STATUS "layers: ${_n} headers, every include within the rule of docs/design.md, no cycles")
