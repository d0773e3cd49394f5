#!/usr/bin/env bash
# t_hub_alloc.sh: the hub (hub/, libkhub's part) allocates through the
# embedder's allocator only (issue 12): no C library allocation call is left
# in its files but the few listed below, each with its reason; cJSON's
# printed text goes back through cJSON_free. tests/test_hub_alloc.c checks
# the other half at run time (a counting allocator sees every block come
# back, an allocation failure at any point leaks nothing). The server
# (server*.c, libkhub_server) and the author library (hub/author/) have
# handles of their own and are not covered here.
set -euo pipefail
SRC=${KHUB_SRC:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }

# file:what, each a deliberate C library allocation:
#   client.c strdup: khub_hub_download_file's string, which 0.1 callers free()
#   kernel_mapping.c calloc/free, project.c free: a khub_mapping is made
#     without a handle, and runtime/kernels/model_kernels.c frees its own with
#     free() (to become a tagged block when that file moves to khub_mapping_free)
allowed='^(hub/client\.c:strdup|hub/kernel_mapping\.c:calloc|hub/kernel_mapping\.c:free|hub/project\.c:free)$'

found=""
n=0
for f in "$SRC"/hub/*.c; do
    case "$f" in */server*.c) continue ;; esac
    n=$((n + 1))
    rel=${f#"$SRC"/}
    # calls, outside comments and string literals (a crude but sufficient strip)
    while IFS= read -r call; do
        [[ "$rel:$call" =~ $allowed ]] || found+="  $rel: $call()"$'\n'
    done < <(sed -e 's://.*$::' -e 's:/\*.*\*/::g' -e 's/"[^"]*"//g' "$f" |
        grep -v '^[[:space:]]*\*' |
        grep -oE '(^|[^a-z_.>])(malloc|calloc|realloc|free|strdup|strndup|aligned_alloc|posix_memalign|asprintf|vasprintf|open_memstream|getline|getdelim)[[:space:]]*\(' |
        sed -E 's/^[^a-z]*//; s/[[:space:]]*\($//')
    # realpath(x, NULL) allocates with malloc
    if grep -nE 'realpath\([^,]*,[[:space:]]*NULL\)' "$f" >/dev/null; then
        found+="  $rel: realpath(..., NULL)"$'\n'
    fi
done
[ "$n" -ge 25 ] || fail "only $n hub files looked at (test out of date?)"
[ -z "$found" ] || fail "C library allocations in hub/ (use khub__mem_* with khub__hub_alloc(hub)):"$'\n'"$found"
echo "ok   $n files of hub/ allocate only through khub__mem_* (the hub's allocator), but the listed exceptions"

# cJSON's text comes from cJSON's allocator: back through cJSON_free.
bad=$(grep -nE 'cJSON_Print' "$SRC"/hub/*.c | grep -v '/server' | cut -d: -f1,2 || true)
for loc in $bad; do
    f=${loc%%:*}; l=${loc##*:}
    var=$(sed -n "${l}p" "$f" | sed -nE 's/.*\b([a-z_]+) = cJSON_Print.*/\1/p')
    [ -n "$var" ] || continue
    if sed -n "$l,$((l + 20))p" "$f" | grep -E "(khub__mem_free|[^_]free)\($var\)" > /dev/null; then
        fail "${f#"$SRC"/}:$l: $var from cJSON_Print is freed other than with cJSON_free"
    fi
done
echo "ok   cJSON's printed text goes back through cJSON_free"
