#!/usr/bin/env bash
# t_install.sh: the installed package, used from outside the tree.
#
# Installs this build (`cmake --install`, no rebuild) into a scratch prefix
# and MOVES it, so everything below runs from a prefix that no path compiled
# into khub names (the tree is relocatable: runtime/base/install_paths.c). Then:
#   - the layout: headers (each compiles on its own), helpers, libkhub.so
#     with SONAME libkhub.so.0,
#     libkhub.a, the plugins with plugins.json (not the test-only
#     cpu-avx512-emu.so), the CLI, khub.pc,
#     khub-plugin.pc, khubConfig.cmake + version file;
#   - the installed CLI lists the installed plugins (not the build tree's)
#     and builds a `khub init` kernel against the installed headers;
#   - (a) tests/install/app.c built with `pkg-config --cflags --libs khub`
#     loads the built-in plugins from the prefix and runs a tiny model;
#     tests/install/serve_app.c built with khub-server.pc starts the hub
#     server library (libkhub_server.so.0) and a client asks it for a repo;
#     tests/install/author_app.c built with khub-author.pc lists the
#     templates libkhub_author.so.0 embeds;
#   - (b) the same app built by CMake with find_package(khub 0.1 COMPONENTS
#     static), against libkhub.so (khub::khub) and libkhub.a
#     (khub::khub_static), serve_app against khub::khub_server, author_app against
#     khub::khub_author, and a plugin
#     module against khub::abi;
#   - (c) tests/install/norm_plugin.c built with `pkg-config --cflags
#     khub-plugin` from the installed headers alone (cc -MM proves it), loaded
#     by the installed libkhub through the app, its norm checked.
# KHUB_PLUGIN_DIR (which ctest sets) is removed from the environment.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin install
BUILD=${KHUB_BUILD:?set by ctest}
unset KHUB_PLUGIN_DIR

if ldd "$BUILD/libkhub.so" 2> /dev/null | grep 'lib[at]san\|libubsan' > /dev/null; then
    t_skip "a sanitizer build is not installed for outside programs (they would need its runtime)"
fi
for tool in cc pkg-config cmake; do
    command -v $tool > /dev/null || t_skip "$tool is not installed"
done

cmake --install "$BUILD" --prefix "$T/stage" > install.log 2>&1 ||
    fail "cmake --install: $(cat install.log)"
grep -v "^-- \(Installing\|Up-to-date\): $T/stage/" install.log |
    grep -v "^-- Set runtime path of \"$T/stage/[^\"]*\" to \"\$ORIGIN[^\"]*\"$" |
    grep -v '^-- Install configuration: ' | grep . && fail "cmake --install wrote outside the prefix (above)"
mv "$T/stage" "$T/pkg"
P=$T/pkg
LIB=$(dirname "$(find "$P" -name libkhub.so.0 | head -n 1)")
[ -d "$LIB" ] || fail "no libkhub.so.0 under $P: $(find "$P")"

# ---- the layout
for f in include/khub/khub.h include/khub/khub_plugin.h include/khub/khub_model.h \
    include/khub/khub_kernels.h include/khub/khub_hub.h include/khub/khub_author.h \
    include/khub/helpers/khub_plugin_util.h bin/khub; do
    [ -f "$P/$f" ] || fail "$f is not installed"
done
for f in libkhub.so libkhub.a libkhub_server.so libkhub_server.a libkhub_author.so \
    libkhub_author.so.0 libkhub_author.a khub/plugins/plugins.json \
    pkgconfig/khub.pc pkgconfig/khub-server.pc pkgconfig/khub-author.pc pkgconfig/khub-plugin.pc \
    cmake/khub/khubConfig.cmake cmake/khub/khubConfigVersion.cmake \
    cmake/khub/khubTargets.cmake; do
    [ -e "$LIB/$f" ] || fail "$LIB/$f is not installed"
done
for l in libkhub libkhub_server libkhub_author; do
    readelf -d "$LIB/$l.so.0" | grep "SONAME.*\[$l\.so\.0\]" > /dev/null ||
        fail "$l.so.0 has no SONAME $l.so.0: $(readelf -d "$LIB/$l.so.0" | grep SONAME)"
done
[ -f "$P/include/khub/khub_server.h" ] && [ -f "$P/include/khub/khub_cache.h" ] ||
    fail "khub_server.h or khub_cache.h is not installed"
python3 - "$LIB/khub/plugins" << 'PY' || fail "the installed plugins do not match plugins.json"
import hashlib, json, os, sys
d = sys.argv[1]
entries = json.load(open(os.path.join(d, "plugins.json")))["plugins"]
assert entries, "plugins.json lists no plugin"
for e in entries:
    got = hashlib.sha256(open(os.path.join(d, e["file"]), "rb").read()).hexdigest()
    assert got == e["sha256"], (e["file"], got, e["sha256"])
PY
# the test-only AVX-512 emulation (tests/t_emu512.sh) is never installed
[ -z "$(find "$P" -name '*emu*')" ] || fail "test-only files installed: $(find "$P" -name '*emu*')"
[ -z "$(ls "$P/include/khub" | grep -v '\.h$' | grep -v '^helpers$')" ] ||
    fail "non-header files installed in include/khub: $(ls "$P/include/khub")"

# every installed header compiles on its own, from the prefix alone
for h in "$P"/include/khub/*.h "$P"/include/khub/helpers/*.h; do
    rel=${h#"$P/include/"}
    echo "#include <$rel>" | cc -std=c11 -Wall -Werror -fsyntax-only -I"$P/include" -x c - ||
        fail "the installed $rel does not compile on its own"
done

# ---- the installed CLI uses the installed plugins
"$P/bin/khub" plugins > plugins.txt 2>&1 || fail "installed khub plugins: $(cat plugins.txt)"
grep -q "^  file   $LIB/khub/plugins/ref-cpu.so$" plugins.txt ||
    fail "installed khub plugins does not load the prefix's ref-cpu: $(grep file plugins.txt)"

# ... and builds a kernel against the prefix's headers (not the source tree's)
"$P/bin/khub" init acme/inst --kind norm --dir inst > init.log 2>&1 || fail "init: $(cat init.log)"
printf '#!/bin/sh\necho "$@" >> %s/cc.log\nexec cc "$@"\n' "$T" > logcc
chmod +x logcc
"$P/bin/khub" build inst --cc "$T/logcc" --quiet > build.log 2>&1 || fail "build: $(cat build.log)"
grep -- "-I$P/include " cc.log > /dev/null || fail "installed khub build: not -I$P/include: $(cat cc.log)"
grep -- "-I$SRC" cc.log && fail "installed khub build used the source tree's headers"

python3 "$SRC/tools/make-tiny-model.py" "$T/tiny"
export PKG_CONFIG_PATH=$LIB/pkgconfig

# ---- (c) a kernel plugin from the installed headers alone
cp "$SRC/tests/install/norm_plugin.c" "$SRC/tests/install/app.c" "$SRC/tests/install/CMakeLists.txt" .
PCFLAGS=$(pkg-config --cflags khub-plugin | xargs)
[ "$(realpath "${PCFLAGS#-I}")" = "$P/include" ] || fail "pkg-config --cflags khub-plugin: '$PCFLAGS'"
# shellcheck disable=SC2086
cc -MM $PCFLAGS norm_plugin.c | tr ' \\' '\n\n' | grep 'khub.*\.h$' | xargs realpath > deps.txt
grep -v "^$P/include/khub/" deps.txt &&
    fail "the plugin compiled against khub headers outside the prefix (above)"
grep -qx "$P/include/khub/helpers/khub_plugin_util.h" deps.txt || fail "helpers not used: $(cat deps.txt)"
cc -std=c11 -O2 -shared -fPIC -fvisibility=hidden -DKHUB_PLUGIN_MODULE $PCFLAGS \
    -Wl,--no-undefined -Wl,-z,now -o install-norm.so norm_plugin.c -lm ||
    fail "the plugin does not build against the installed headers"
SHA=$(sha256sum install-norm.so | cut -d' ' -f1)

# ---- (a) an application with pkg-config
# shellcheck disable=SC2046
cc -std=c11 -o app-pc app.c $(pkg-config --cflags --libs khub) -lm -Wl,-rpath,"$LIB" ||
    fail "the app does not build with pkg-config"
ldd app-pc | grep "libkhub.so.0 => $LIB/libkhub.so.0" > /dev/null ||
    fail "app-pc does not use the installed libkhub: $(ldd app-pc | grep khub)"
./app-pc --plugin "$T/install-norm.so" "$SHA" --model "$T/tiny" > app-pc.out 2>&1 ||
    fail "app-pc: $(cat app-pc.out)"
grep -q "^plugin khub/ref-cpu [0-9.]* $LIB/khub/plugins/ref-cpu.so$" app-pc.out ||
    fail "app-pc did not load the prefix's built-in plugins: $(cat app-pc.out)"
grep -q "^norm: acme/install-norm 1.0.0 :: rms_norm$" app-pc.out || fail "norm: $(cat app-pc.out)"
grep -q "^norm: ok$" app-pc.out || fail "norm: $(cat app-pc.out)"
grep -q "^generated 4 tokens$" app-pc.out || fail "tiny model: $(cat app-pc.out)"
# ... and one on the hub server library (khub-server.pc: -lkhub_server -lkhub)
cp "$SRC/tests/install/serve_app.c" .
mkdir -p repos
# shellcheck disable=SC2046
cc -std=c11 -o serve-pc serve_app.c $(pkg-config --cflags --libs khub-server) \
    -Wl,-rpath,"$LIB" || fail "serve_app does not build with pkg-config khub-server"
check_serve_app() { # $1: the program
    ldd "$1" | grep "libkhub_server.so.0 => $LIB/libkhub_server.so.0" > /dev/null ||
        fail "$1 does not use the installed libkhub_server: $(ldd "$1" | grep khub)"
    "$1" "$T/repos" > "$1.out" 2>&1 || fail "$1: $(cat "$1.out")"
    grep -q "^resolve KHUB_STATUS_REPO_NOT_FOUND$" "$1.out" || fail "$1: $(cat "$1.out")"
    grep -q "^bad dir KHUB_STATUS_NOT_FOUND: serve: /nonexistent/khub-repos is not a directory" \
        "$1.out" || fail "$1: $(cat "$1.out")"
}
check_serve_app ./serve-pc
# ... and one on the kernel author's library (khub-author.pc: -lkhub_author -lkhub)
cp "$SRC/tests/install/author_app.c" .
# shellcheck disable=SC2046
cc -std=c11 -o author-pc author_app.c $(pkg-config --cflags --libs khub-author) \
    -Wl,-rpath,"$LIB" || fail "author_app does not build with pkg-config khub-author"
check_author_app() { # $1: the program
    ldd "$1" | grep "libkhub_author.so.0 => $LIB/libkhub_author.so.0" > /dev/null ||
        fail "$1 does not use the installed libkhub_author: $(ldd "$1" | grep khub)"
    "$1" > "$1.out" 2>&1 || fail "$1: $(cat "$1.out")"
    grep -q "^templates [1-9][0-9]*$" "$1.out" || fail "$1: $(cat "$1.out")"
    grep -q "^template norm rms_norm cuda=1$" "$1.out" || fail "$1 lists no norm template: $(cat "$1.out")"
    grep -q "^out of range KHUB_STATUS_INVALID_ARG$" "$1.out" || fail "$1: $(cat "$1.out")"
}
check_author_app ./author-pc

# ---- (b) the same with CMake's find_package
cmake -S . -B cm -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_RPATH="$LIB" > cm.log 2>&1 ||
    fail "find_package(khub): $(cat cm.log)"
grep -q "^khub 0\.[0-9.]* abi 1\.[0-9]* plugins $LIB/khub/plugins$" cm/found.txt ||
    fail "find_package(khub) variables: $(cat cm/found.txt)"
cmake --build cm -j2 > cm-build.log 2>&1 || fail "the CMake build: $(cat cm-build.log)"
cm/app --plugin "$T/install-norm.so" "$SHA" --model "$T/tiny" > app-cm.out 2>&1 ||
    fail "cm/app: $(cat app-cm.out)"
grep -q "^plugin khub/ref-cpu [0-9.]* $LIB/khub/plugins/ref-cpu.so$" app-cm.out ||
    fail "cm/app did not load the prefix's built-in plugins: $(cat app-cm.out)"
grep -q "^generated 4 tokens$" app-cm.out || fail "cm/app: $(cat app-cm.out)"
check_serve_app cm/serve_app
check_author_app cm/author_app
# libkhub.a in a program outside the prefix: the plugins are named by the
# variable the package exports (the program cannot find them next to itself).
KHUB_PLUGIN_DIR=$LIB/khub/plugins cm/app_static --plugin "$T/cm/install_norm.so" \
    "$(sha256sum cm/install_norm.so | cut -d' ' -f1)" > app-static.out 2>&1 ||
    fail "cm/app_static: $(cat app-static.out)"
grep -q "^norm: ok$" app-static.out || fail "cm/app_static: $(cat app-static.out)"
ldd cm/app_static | grep libkhub > /dev/null && fail "app_static links libkhub.so: $(ldd cm/app_static)"
echo "install: layout, CLI, pkg-config app, CMake app (shared and static), plugin: ok"
