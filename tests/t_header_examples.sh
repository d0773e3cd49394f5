#!/usr/bin/env bash
# t_header_examples.sh: every usage example in the opening comment of a public
# header (abi/khub/*.h: the lines indented "*     ") compiles as C11 with
# -Wall -Werror against the headers and links against this build's libkhub,
# so the examples cannot go stale. A line that is only "..." is a placeholder
# and dropped. khub_plugin.h's example is a whole plugin file; every other one
# is a function body, wrapped in a function that returns int and sees a
# runtime `rt`, a hub `hub` and a `norm_args` (names its prose takes as given).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin header_examples

CC=${CC:-cc}
LIB=${KHUB_BUILD:?set by ctest}/libkhub.so
[ -f "$LIB" ] || fail "no $LIB"
# khub_server.h's example links libkhub_server too (when it is built).
SERVER_LIB=
[ -f "$KHUB_BUILD/libkhub_server.so" ] && SERVER_LIB=$KHUB_BUILD/libkhub_server.so
# khub_model_server.h's example links libkhub_model_server too.
[ -f "$KHUB_BUILD/libkhub_model_server.so" ] &&
    SERVER_LIB="$SERVER_LIB $KHUB_BUILD/libkhub_model_server.so"
# khub_author.h's example links libkhub_author too.
[ -f "$KHUB_BUILD/libkhub_author.so" ] && SERVER_LIB="$SERVER_LIB $KHUB_BUILD/libkhub_author.so"
# khub_tune.h's example links libkhub_tune too.
[ -f "$KHUB_BUILD/libkhub_tune.so" ] && SERVER_LIB="$SERVER_LIB $KHUB_BUILD/libkhub_tune.so"
n=0
for h in "$SRC"/abi/khub/*.h; do
    base=$(basename "$h" .h)
    # The opening comment's example blocks, one file per block.
    awk -v out="$T/$base" '
        NR == 1 && !/^\/\*/ { exit }
        /\*\// { exit }
        /^ \*     / { if (!inblk && !blank) next # a list item'"'"'s continuation
                      if (!inblk) { blk++; inblk = 1 }
                      line = substr($0, 8); if (line ~ /^[ ]*\.\.\.[ ]*(\/\/.*)?$/) next
                      print line > (out "." blk ".body"); next }
        { inblk = 0; blank = ($0 ~ /^ \*[ ]*$/) }' "$h"
    for body in "$T/$base".*.body; do
        [ -e "$body" ] || continue
        n=$((n + 1))
        src=$body.c
        if [ "$base" = khub_plugin ]; then
            [ "$body" = "$T/$base.1.body" ] || continue # its blocks are one file
            cat "$T/$base".*.body > "$src"
            "$CC" -std=c11 -Wall -Werror -Wno-unused-function -Wno-unused-variable \
                -I"$SRC/abi" -c "$src" -o "$src.o" 2> cc.log ||
                fail "$base.h: the example does not compile: $(cat cc.log) -- $(cat "$src")"
            continue
        fi
        {
            echo '#include <assert.h>'
            echo '#include <stdio.h>'
            for inc in "$SRC"/abi/khub/*.h; do echo "#include <khub/$(basename "$inc")>"; done
            echo 'static khub_runtime *rt;'
            echo 'static khub_hub *hub;'
            echo 'static khub_norm_args norm_args;'
            echo 'static int example(void)'
            echo '{'
            echo '    {'
            cat "$body"
            echo '    }'
            echo '    return 0;'
            echo '}'
            echo 'int main(int argc, char **argv)'
            echo '{'
            echo '    (void)argv;'
            echo '    return argc > 99 ? example() : 0; /* linked, never run */'
            echo '}'
        } > "$src"
        "$CC" -std=c11 -Wall -Werror -Wno-unused-variable -Wno-unused-but-set-variable \
            -Wno-unused-value -I"$SRC/abi" "$src" -o "$src.bin" $SERVER_LIB "$LIB" 2> cc.log ||
            fail "$base.h: example $(basename "$body") does not compile: $(cat cc.log)"
    done
done
[ "$n" -ge 8 ] || fail "found only $n examples in abi/khub/*.h"
echo "ok      $n header examples compile and link"
echo "1 passed, 0 failed, 0 skipped"
