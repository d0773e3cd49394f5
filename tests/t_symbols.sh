#!/usr/bin/env bash
# The linking contract of issue 2: libkhub exports exactly the symbols
# abi/SYMBOLS.md lists, its SONAME is the major version, neither it nor the
# CLI links the CUDA driver or NVRTC (both are dlopened), and every built-in
# plugin exports only its entry and does not link libkhub. Issue 12: the hub
# server and fault injector are libkhub_server, out of libkhub; the kernel
# author's code (compiler driver, templates) is libkhub_author, which
# exports exactly its part of SYMBOLS.md and links libkhub (NVRTC, opened at
# run time, is libkhub's since issue 19: plugins compile at load through it).
set -euo pipefail
B=${KHUB_BUILD:?}
fail() { echo "FAIL: $*"; exit 1; }

bash "${KHUB_SRC:?}/tools/check-symbols.sh" --headers "$B/libkhub.so" "$B/libkhub_server.so" \
    "$B/libkhub_author.so" "$B/libkhub_model_server.so" "$B/libkhub_tune.so"

major=$(sed -n 's/^#define KHUB_VERSION_MAJOR *\([0-9]*\).*/\1/p' "$KHUB_SRC/abi/khub/khub_version.h")
soname=$(readelf -d "$B/libkhub.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub.so.$major" ] || fail "SONAME is '$soname', want libkhub.so.$major"
echo "ok   SONAME $soname"

# The hub server is libkhub_server (issue 12): libkhub neither links
# libmicrohttpd nor carries server or fault-injection code, and
# libkhub_server exports exactly what khub_server.h declares.
soname=$(readelf -d "$B/libkhub_server.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub_server.so.$major" ] || fail "SONAME is '$soname', want libkhub_server.so.$major"
dyn=$(readelf -d "$B/libkhub.so")
if grep -q 'NEEDED.*libmicrohttpd' <<< "$dyn"; then fail "libkhub.so links libmicrohttpd"; fi
if ldd "$B/libkhub.so" | grep libmicrohttpd > /dev/null; then fail "libkhub.so pulls libmicrohttpd in"; fi
dyn=$(readelf -d "$B/libkhub_server.so")
grep -q "NEEDED.*\[libkhub.so.$major\]" <<< "$dyn" || fail "libkhub_server.so does not link libkhub"
# The model server (issue 16) is libkhub_model_server, on top of libkhub.
soname=$(readelf -d "$B/libkhub_model_server.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub_model_server.so.$major" ] ||
    fail "SONAME is '$soname', want libkhub_model_server.so.$major"
grep -q "NEEDED.*\[libkhub.so.$major\]" <<< "$(readelf -d "$B/libkhub_model_server.so")" ||
    fail "libkhub_model_server.so does not link libkhub"
# The advisor (issue 17) is libkhub_tune, on top of libkhub's public API.
soname=$(readelf -d "$B/libkhub_tune.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub_tune.so.$major" ] || fail "SONAME is '$soname', want libkhub_tune.so.$major"
grep -q "NEEDED.*\[libkhub.so.$major\]" <<< "$(readelf -d "$B/libkhub_tune.so")" ||
    fail "libkhub_tune.so does not link libkhub"
grep -q 'NEEDED.*libmicrohttpd' <<< "$dyn" || fail "libkhub_server.so does not link libmicrohttpd"
undef=$(nm -D --undefined-only "$B/libkhub.so")
if grep -q ' MHD_' <<< "$undef"; then fail "libkhub.so calls libmicrohttpd"; fi
syms=$(nm "$B/libkhub.so" 2>/dev/null || true) # empty when stripped
if grep -E 'khub__srv_|khub__server_|khub_server_' <<< "$syms"; then
    fail "libkhub.so carries server or fault-injection code"
fi
text=$(strings -a "$B/libkhub.so")
for s in 'unknown fault' 'serve: cannot listen' 'drop-body'; do
    if grep -qF "$s" <<< "$text"; then fail "libkhub.so holds the server's string '$s'"; fi
done
declared=$(grep -ohE 'KHUB_API[^;(]*\bkhub_[a-z0-9_]+ *\(' "$KHUB_SRC/abi/khub/khub_server.h" |
    grep -oE 'khub_[a-z0-9_]+ *\($' | tr -d ' (' | sort)
exported=$(nm -D --defined-only "$B/libkhub_server.so" | awk 'NF >= 3 {print $3}' | sort)
[ -n "$declared" ] && [ "$declared" = "$exported" ] ||
    fail "libkhub_server exports: $(echo $exported); khub_server.h declares: $(echo $declared)"
echo "ok   libkhub_server.so.$major: the server and its faults, linking libkhub and libmicrohttpd; libkhub links neither"

soname=$(readelf -d "$B/libkhub_author.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub_author.so.$major" ] || fail "libkhub_author SONAME is '$soname'"
readelf -d "$B/libkhub_author.so" | grep "NEEDED.*\[libkhub.so.$major\]" > /dev/null ||
    fail "libkhub_author.so does not link libkhub.so.$major"
echo "ok   libkhub_author: SONAME $soname, links libkhub.so.$major"

# One way into libkhub for every sibling library (issue 12): its Private
# exports. Neither defines any of them itself (no copy of a libkhub source
# compiled in), and each calls at least one.
private=$(awk '/^## Private/ {on = 1; next} /^## / {on = 0} on && /^- `/ {gsub(/[-` ]/, ""); print}' \
    "$KHUB_SRC/abi/SYMBOLS.md" | sort)
[ -n "$private" ] || fail "SYMBOLS.md lists no Private exports (test out of date?)"
for lib in libkhub_server libkhub_author libkhub_model_server; do
    own=$(nm --defined-only "$B/$lib.so" | awk 'NF >= 3 {print $3}' | sort -u)
    copies=$(comm -12 <(echo "$private") <(echo "$own"))
    [ -z "$copies" ] || fail "$lib.so defines libkhub's private functions itself: $(echo $copies)"
    used=$(nm -D --undefined-only "$B/$lib.so" | awk '{print $2}' | sort -u)
    [ -n "$(comm -12 <(echo "$private") <(echo "$used"))" ] ||
        fail "$lib.so calls none of libkhub's private exports (test out of date?)"
done
echo "ok   libkhub_server, libkhub_author and libkhub_model_server reach libkhub only through its Private exports"

# libkhub.so holds no authoring code: none of its symbols (the full symbol
# table, hidden ones too: nm, not only nm -D) is the compiler driver's or
# the templates', none of its dynamic symbols is khub_author_*, and no
# template's text is in its bytes. NVRTC is opened by libkhub since issue 19
# (load-time compilation, runtime/device/nvrtc.c); `khub build` reaches it
# through libkhub's Private exports, so libkhub_author holds no copy.
all_syms=$(nm "$B/libkhub.so")
grep -q ' khub__pool_new$' <<< "$all_syms" || fail "libkhub.so has no symbol table to check (stripped?)"
if grep -E ' (khub__kernel_build|khub__variant_pack|khub__cpu_variant_name|khub__author_[a-z_]*|khub_author_[a-z_]*)$' <<< "$all_syms"; then
    fail "libkhub.so contains authoring code (above)"
fi
if nm -D --defined-only "$B/libkhub.so" | grep ' khub_author_'; then fail "libkhub.so exports khub_author_*"; fi
if grep -aq TEMPLATE_CNAME "$B/libkhub.so"; then fail "libkhub.so contains 'TEMPLATE_CNAME'"; fi
grep -aq TEMPLATE_CNAME "$B/libkhub_author.so" || fail "libkhub_author.so lacks 'TEMPLATE_CNAME' (test out of date?)"
grep -aq libnvrtc "$B/libkhub.so" || fail "libkhub.so lacks 'libnvrtc' (test out of date?)"
if grep -aq libnvrtc "$B/libkhub_author.so"; then fail "libkhub_author.so carries its own NVRTC loader"; fi
echo "ok   libkhub.so carries no compiler driver or templates (libkhub_author.so does); NVRTC is opened by libkhub only"

for f in "$B/libkhub.so" "$B/libkhub_author.so" "${KHUB_BIN:?}"; do
    dyn=$(readelf -d "$f") || fail "cannot read $f"
    if grep -E 'NEEDED.*(libcuda|libnvrtc|libcudart)' <<< "$dyn"; then
        fail "$f links CUDA; it must be opened at run time"
    fi
done
echo "ok   libkhub, libkhub_author and khub link no CUDA library"

n=0
for so in "$B"/plugins/*.so; do
    exports=$(nm -D --defined-only "$so" | awk 'NF >= 3 {print $3}')
    [ "$exports" = "khub_plugin_init_v1" ] || fail "$so exports: $(echo $exports)"
    # Captured first: grep -q closing the pipe early would fail it under pipefail.
    dyn=$(readelf -d "$so")
    sections=$(readelf -S -W "$so")
    if grep -q 'NEEDED.*libkhub' <<< "$dyn"; then fail "$so links libkhub"; fi
    grep -q '\.note\.khub' <<< "$sections" || fail "$so has no .note.khub"
    n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no built-in plugins in $B/plugins"
echo "ok   $n built-in plugins export only khub_plugin_init_v1, carry .note.khub, skip libkhub"
echo "7 passed, 0 failed"
