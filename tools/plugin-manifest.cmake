# Writes OUT: {"plugins":[{"file":"ref-cpu.so","sha256":"..."}]} for FILES
# (the khub_plugin_manifest target, after every built-in plugin is built).
# With UPDATE=FILE instead of FILES, sets FILE's entry in OUT (added when
# absent) and keeps the others: every built-in plugin's own build runs it
# (POST_BUILD, khub_add_plugin), so building one plugin target alone
# (`cmake --build build --target cpu-avx2`) leaves no stale digest for the
# loader to refuse. Entries are sorted by file name. LOCK (default OUT.lock)
# serialises the updates of plugins built in parallel.
function(entry_of f out)
    file(SHA256 ${f} digest)
    get_filename_component(name ${f} NAME)
    set(${out} "    {\"file\": \"${name}\", \"sha256\": \"${digest}\"}" PARENT_SCOPE)
endfunction()

if(NOT LOCK)
    set(LOCK ${OUT}.lock)
endif()
file(LOCK ${LOCK} GUARD PROCESS TIMEOUT 300)
set(entries "")
if(UPDATE)
    get_filename_component(mine ${UPDATE} NAME)
    entry_of(${UPDATE} line)
    list(APPEND entries "${line}")
    if(EXISTS ${OUT})
        file(STRINGS ${OUT} lines REGEX "\"file\": \"")
        foreach(l IN LISTS lines)
            string(REGEX MATCH "\"file\": \"([^\"]*)\"" unused "${l}")
            if(NOT CMAKE_MATCH_1 STREQUAL mine)
                string(REGEX REPLACE "^ *(\\{.*\\}),? *$" "    \\1" l "${l}")
                list(APPEND entries "${l}")
            endif()
        endforeach()
    endif()
else()
    foreach(f ${FILES})
        entry_of(${f} line)
        list(APPEND entries "${line}")
    endforeach()
endif()
list(SORT entries)
list(JOIN entries ",\n" body)
file(WRITE ${OUT}.tmp "{\n  \"plugins\": [\n${body}\n  ]\n}\n")
file(RENAME ${OUT}.tmp ${OUT})
