#!/usr/bin/env bash
# t_doc_authoring.sh: docs/authoring.md's commands work as written. Its sh
# blocks, in order, run as one script (set -eu, as a user's shell would not
# stop a pipe at `head`) with this build's khub first on PATH, in a scratch
# folder; the lines the page shows as output (commit and key ids aside) must
# appear.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin docauth
command -v cc > /dev/null || t_skip "no C compiler"
unset HF_ENDPOINT HF_TOKEN KHUB_CACHE KHUB_POLICY HF_HUB_OFFLINE

python3 - "$SRC/docs/authoring.md" > doc.sh << 'PY'
import re, sys
blocks = re.findall(r"```sh\n(.*?)```", open(sys.argv[1]).read(), re.S)
print("set -eu")
# the page kills its server itself; the trap's kill then finds it gone,
# and a failing trap would become the script's exit status
print("trap '[ -z \"${SERVER:-}\" ] || kill \"$SERVER\" 2> /dev/null || true' EXIT")
print("\n".join(blocks))
PY
[ "$(grep -c '^khub ' doc.sh)" -ge 7 ] || fail "docs/authoring.md lost its commands: $(cat doc.sh)"
PATH="$(dirname "$KHUB"):$PATH" KHUB_SRC=$SRC timeout 300 bash doc.sh > out.txt 2> err.txt ||
    fail "docs/authoring.md's commands failed: $(tail -n 20 out.txt err.txt)"
for want in "ok   acme/rmsnorm 1.0.0: 1 variant, 0 findings" \
    "signed rmsnorm/build/khub1-cpu-x86_64-linux/metadata.json" \
    "rmsnorm 1.0.0 -> acme/rmsnorm@v1: 5 files, 0 unchanged, 3 uploaded, 0 deleted" \
    "rms_norm[f32]: acme/rmsnorm 1.0.0 :: rms_norm" \
    "wrote app/khub.lock (1 kernel)"; do
    grep -qxF "$want" out.txt err.txt || fail "the page's output lacks '$want': $(cat out.txt)"
    grep -qF "$want" "$SRC/docs/authoring.md" || fail "the page no longer shows '$want'"
done
grep -q "^norm: acme/rmsnorm@version=1 -> .*(locked, hashes re-checked); metadata.json signed with key [0-9a-f]*, accepted by the policy$" out.txt ||
    fail "the locked run: $(cat out.txt)"
