#!/usr/bin/env bash
# t_doc_flags.sh: README.md and docs/*.md name only commands and flags that
# `khub --help` and `khub COMMAND --help` have, and every flag a command's
# --help prints is described there, not only listed in its usage line
# (tests/doc_flags.py). First the checker itself must fail on a page naming a
# made-up flag, a made-up command, and a help that lists a flag in its usage
# line only, so it cannot pass by finding nothing.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin docflags
command -v python3 > /dev/null || t_skip "python3 absent"

# ---- the checker finds what it must --------------------------------------
cat > fake-khub << 'SH'
#!/usr/bin/env bash
case "$1" in
--help) printf 'usage: khub <command>\n\nCommands:\n  run    go\n\nOptions:\n' ;;
run) printf 'usage: khub run [--model PATH] [--zzz]\n\n  --model PATH  the model\n' ;;
*) exit 2 ;;
esac
SH
chmod +x fake-khub
cat > page.md << 'MD'
Run `khub run --model m.gguf --made-up-flag 3`, or

```sh
khub run --model m.gguf \
    --also-made-up
khub walk --model m.gguf
```
MD
rc=0
python3 "$SRC/tests/doc_flags.py" ./fake-khub page.md > out.txt || rc=$?
[ "$rc" = 1 ] || fail "the checker exited $rc on a page with made-up flags: $(cat out.txt)"
for want in "page.md: khub run --made-up-flag: not in khub run --help" \
    "page.md: khub run --also-made-up: not in khub run --help" \
    "page.md: khub walk: no such command in khub --help" \
    "khub run --help: --zzz is in the usage line only, never described"; do
    grep -qF "$want" out.txt || fail "the checker missed '$want': $(cat out.txt)"
done
[ "$(wc -l < out.txt)" = 4 ] || fail "the checker found more than it should: $(cat out.txt)"

# ---- the real pages and the real --help ----------------------------------
python3 "$SRC/tests/doc_flags.py" "$KHUB" "$SRC/README.md" "$SRC"/docs/*.md > out.txt ||
    fail "docs and --help disagree:
$(cat out.txt)"
echo "1 passed, 0 failed"
