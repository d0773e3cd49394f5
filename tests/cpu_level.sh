#!/usr/bin/env bash
# cpu_level.sh LEVEL CMD [ARGS...]: runs a test as a CPU of LEVEL (x86-64,
# avx2, avx512) would, through KHUB_CPU_LEVEL (runtime/device/cpu.c): the ctest
# entries NAME@LEVEL of tests/CMakeLists.txt. A level above this CPU's is
# skipped with the reason (exit 77, ctest's SKIP_RETURN_CODE), not failed;
# the mask is checked to take effect (`khub cpu` reports LEVEL) before CMD
# runs.
set -euo pipefail
level=${1:?usage: cpu_level.sh LEVEL CMD [ARGS...]}
shift
KHUB=${KHUB_BIN:?KHUB_BIN is set by ctest}

level_of() { sed -n 's/^level *\([a-z0-9-]*\).*/\1/p'; }
rank() {
    case $1 in
    x86-64) echo 0 ;;
    avx2) echo 1 ;;
    avx512) echo 2 ;;
    *) echo "cpu_level.sh: unknown level '$1'" >&2 && exit 2 ;;
    esac
}

host=$(env -u KHUB_CPU_LEVEL "$KHUB" cpu)
host_level=$(level_of <<< "$host")
if [ "$(rank "$level")" -gt "$(rank "$host_level")" ]; then
    echo "skip: KHUB_CPU_LEVEL=$level: this CPU reaches $host_level ($(sed -n 's/^features //p' <<< "$host"))"
    exit 77
fi
got=$(KHUB_CPU_LEVEL=$level "$KHUB" cpu | level_of)
if [ "$got" != "$level" ]; then
    echo "FAIL: KHUB_CPU_LEVEL=$level: khub cpu reports level '$got'" >&2
    exit 1
fi
echo "cpu_level.sh: KHUB_CPU_LEVEL=$level"
export KHUB_CPU_LEVEL=$level
exec "$@"
