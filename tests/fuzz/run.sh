#!/usr/bin/env bash
# Builds the fuzzers (the model parsers, fuzz_hub_formats for every
# hub-side format, the archive unpacker, the plugin ELF gate, the prompts
# file, and the model server's bodies, response headers and chat templates:
# docs/security.md lists them) with clang (libFuzzer + ASan + UBSan) and runs
# each for a bounded time on a seed corpus made from the test fixtures, the
# golden files, the in-tree kernels and the built plugins.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET]     default 60
#
# Environment: KHUB_FUZZ_TARGETS (the targets to run, by short name; default
# all), KHUB_FUZZ_BUILD (build folder, default build-fuzz under the
# source tree), KHUB_FUZZ_JOBS (make -j, default 2), KHUB_FUZZ_PLUGINS (a
# build folder whose plugins seed fuzz_elf, default build under the source
# tree; none there: fuzz_elf starts from /bin/true). Crashes are written to
# the build folder as crash-*; the script exits non-zero on the first one.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(realpath -m "${KHUB_FUZZ_BUILD:-$SRC/build-fuzz}")" # absolute: the runs cd into it
SECS="${1:-60}"
JOBS="${KHUB_FUZZ_JOBS:-2}"
TARGETS="${KHUB_FUZZ_TARGETS:-gguf safetensors model_config tokenizer hub_formats archive elf prompts requests hub_server}"

CC=clang cmake -S "$SRC" -B "$BUILD" -DKHUB_FUZZ=ON -DKHUB_SANITIZE=address,undefined \
    -DKHUB_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target make_seeds fuzz_gguf fuzz_safetensors fuzz_model_config \
    fuzz_tokenizer fuzz_hub_formats fuzz_archive fuzz_elf fuzz_prompts fuzz_requests fuzz_hub_server

CORPUS="$BUILD/fuzz-corpus"
for t in gguf safetensors model_config tokenizer hub_formats archive elf prompts requests hub_server; do
    mkdir -p "$CORPUS/$t" # every seed folder: KHUB_FUZZ_TARGETS may name a few
done
"$BUILD/tests/fuzz/make_seeds" "$CORPUS"
cp "$SRC"/tests/golden/*.gguf "$CORPUS/gguf/" 2>/dev/null || true
cp "$SRC"/tests/golden/*.safetensors "$CORPUS/safetensors/" 2>/dev/null || true
# text mode (an odd first byte: (byte / 2) mod 8 picks the fixture tokenizer):
# the strings of the fixtures' corpora, a few per tokenizer
python3 - "$SRC" "$CORPUS/tokenizer" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
texts = []
for f in ("tokenizer/corpus.json", "tokenizer/spm/corpus.json", "tokenizer/chat.json"):
    try:
        j = json.load(open(f"{src}/tests/fixtures/{f}", encoding="utf-8"))
    except (OSError, ValueError):
        continue
    stack = [j]
    while stack:
        v = stack.pop()
        if isinstance(v, str) and 0 < len(v.encode()) <= 1024: texts.append(v)
        elif isinstance(v, dict): stack.extend(v.values())
        elif isinstance(v, list): stack.extend(v)
texts = sorted(set(texts))[:400]
for i, t in enumerate(texts):
    with open(f"{out}/text-{i:03d}", "wb") as fh:
        fh.write(bytes([1 + 2 * (i % 8)]) + t.encode())
PY
# tokenizer.json mode (an even first byte): every fixture tokenizer, the
# SentencePiece-style shapes and Unigram models of tests/fixtures/tokenizer/spm too
for j in "$SRC"/tests/fixtures/tokenizer/*/tokenizer.json "$SRC"/tests/fixtures/tokenizer/spm/*.json \
    "$SRC"/tests/fixtures/gemma3_tiny/tokenizer.json; do
    [ "$(basename "$j")" = corpus.json ] && continue
    { printf '\0'; cat "$j"; } > "$CORPUS/tokenizer/json-$(basename "$(dirname "$j")")-$(basename "$j")"
done
# hub_formats: the first byte picks the parser (see fuzz_hub_formats.c).
hub_seed() { { printf "\\$(printf '%03o' "$1")"; cat; } > "$CORPUS/hub_formats/seed-$1-$2"; }
C=1111111111111111111111111111111111111111
printf 'kernels-community/flash-attn2@version=1:flash_attn' | hub_seed 0 id
printf '[{"type":"file","path":"build/v/a.so","oid":"%s","size":3,"lfs":{"oid":"%s","size":3}},{"type":"directory","path":"build","oid":"%s","size":0}]' \
    $C "$C$C" $C | hub_seed 1 tree
printf '{"format":1,"name":"org/k","version":"1.0.0","major":1,"variant":"khub1-cpu-x86_64-linux","abi":{"major":1,"minor":0},"backend":{"type":"cpu","archs":["x86_64"]},"plugins":[{"file":"k.so","level":"generic","cpu_features":[]}],"files":{"k.so":"%s"},"provenance":{"source_commit":"unknown","dirty":false}}' \
    "$C$C" | hub_seed 2 meta
for k in "$SRC"/kernels-src/*/kernel.json; do hub_seed 3 "$(basename "$(dirname "$k")")" < "$k"; done
printf '{"format":1,"roles":{"attention":"kernels-community/flash-attn2@version=1:flash_attn","norm":{"cpu":{"repo":"kernels-community/rmsnorm","version":1},"cuda":[{"repo":"a/b","revision":"main","capability":[75,90]}]}},"dependencies":{"kernels-community/activation":{"version":1}}}' \
    | hub_seed 4 mapping
printf '{"format":1,"kernels":[{"repo":"a/b","version":1,"commit":"%s","variants":{"khub1-cpu-x86_64-linux":{"hash":"sha256:%s","files":{"k.so":"%s"}}}}]}' \
    $C "$C$C" "$C$C" | hub_seed 5 lock
printf '{"version":1,"publishers":{"kernels-community":["khub-ed25519 AAAA"]},"revoked":["0123456789abcdef"],"allow_unsigned":["my-org"]}' \
    | hub_seed 6 policy
printf '{"format":1,"key_id":"0123456789abcdef","sig":"AAAA"}' | hub_seed 7 sig
printf 'khub-ed25519 MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=' | hub_seed 8 pubkey
# the hub's answers about revisions (9: resolved to version byte/12 - 1)
REFS='{"branches":[{"name":"main","ref":"refs/heads/main","targetCommit":"'$C'"},{"name":"v1","ref":"refs/heads/v1","targetCommit":"'$C'"},{"name":"v12","targetCommit":"'$C'"}],"tags":[],"converts":[]}'
printf '%s' "$REFS" | hub_seed 9 refs-newest
printf '%s' "$REFS" | hub_seed 33 refs-v1
printf '{"id":"org/k","sha":"%s","siblings":[]}' $C | hub_seed 10 revision
printf '%s' "$REFS" | hub_seed 11 refs-versions
# hub_server: the first byte picks the request (see fuzz_hub_server.c)
srv_seed() { { printf "\\$(printf '%03o' "$1")"; cat; } > "$CORPUS/hub_server/seed-$1-$2"; }
OID=781f1a15e191cad9de5075c2b566ba2b9bd286e33f2d5d4f1511d411e67aeb23 # sha256("lfs object")
printf '{"files":[{"path":"a.bin","size":3,"sample":"YWJj"},{"path":"README.md","size":5,"sample":"aGVsbG8="}]}' |
    srv_seed 0 preupload
printf '{"key":"header","value":{"summary":"s","description":"d"}}\n{"key":"file","value":{"path":"n/x.txt","content":"aGk=","encoding":"base64"}}\n{"key":"lfsFile","value":{"path":"m.bin","algo":"sha256","oid":"%s","size":10}}\n{"key":"deletedFile","value":{"path":"README.md"}}\n{"key":"deletedFolder","value":{"path":"docs/"}}\n' \
    $OID | srv_seed 1 commit-ndjson
printf '{"summary":"s","parentCommit":"%s","files":[{"path":"n.txt","content":"hi","encoding":"utf-8"}],"lfsFiles":[{"path":"x.bin","oid":"%s","size":10}],"deletedFiles":[{"path":"w.bin"}],"deletedFolders":[{"path":"docs"}]}' \
    $C $OID | srv_seed 2 commit-json
printf '{"operation":"upload","transfers":["basic"],"hash_algo":"sha256","objects":[{"oid":"%s","size":10},{"oid":"%s","size":5}]}' \
    $OID "$C$C" | srv_seed 3 lfs-batch
printf '{"oid":"%s","size":10}' $OID | srv_seed 4 lfs-verify
printf 'paths=README.md&paths=docs&paths=w.bin&expand=true' | srv_seed 5 paths-form
printf '{"paths":["w.bin","docs/a.md","nope"],"expand":true}' | srv_seed 6 paths-json
printf '{"type":"kernel","name":"demo2","organization":"org"}' | srv_seed 7 create
printf 'POST /api/kernels/org/demo/branch/dev\n{"startingPoint":"main"}' | srv_seed 8 branch
printf 'POST /api/kernels/org/demo/tag/main\n{"tag":"v9","message":"m"}' | srv_seed 8 tag
printf 'DELETE /api/kernels/org/demo/branch/v1\n' | srv_seed 8 delete
printf 'GET /api/kernels/org/demo/tree/main/docs?recursive=true&expand=true\n' | srv_seed 8 tree
printf 'GET /org/demo/resolve/main/w.bin\n' | srv_seed 8 resolve
printf 'GET /api/kernels/org/demo/refs\n' | srv_seed 8 refs
printf 'GET /api/kernels/org/demo/revision/main\n' | srv_seed 8 revision
printf 'PUT /lfs-upload/org/demo/%s/10\nlfs object' $OID | srv_seed 8 put
# archive: a good variant archive, and the hostile kinds the unpacker refuses
python3 - "$CORPUS/archive" <<'PY'
import io, sys, tarfile
def tgz(name, members):
    with tarfile.open(f"{sys.argv[1]}/seed-{name}.tar.gz", "w:gz") as t:
        for m, data in members:
            t.addfile(m, io.BytesIO(data) if data is not None else None)
def f(path, data=b"x"):
    ti = tarfile.TarInfo(path); ti.size = len(data); return ti, data
def d(path):
    ti = tarfile.TarInfo(path); ti.type = tarfile.DIRTYPE; return ti, None
def link(path, target, kind=tarfile.SYMTYPE):
    ti = tarfile.TarInfo(path); ti.type = kind; ti.linkname = target; return ti, None
tgz("good", [d("v"), f("v/metadata.json", b'{"format":1}'), f("v/k.so", b"\x7fELF" + bytes(64))])
tgz("dotdot", [f("../escape"), f("a/../../b")])
tgz("absolute", [f("/tmp/abs")])
tgz("links", [link("s", "/etc"), link("h", "s", tarfile.LNKTYPE), f("s/x")])
ti = tarfile.TarInfo("fifo"); ti.type = tarfile.FIFOTYPE
tgz("fifo", [(ti, None)])
tgz("bomb", [f("z", bytes(3 << 20))])
PY
# elf: the built plugins, stripped of their symbol tables (the .dynsym, the
# notes and the dynamic section stay), when a build of them is at hand:
# KHUB_FUZZ_PLUGINS (a build folder, default build under the source tree).
PLUGINS="${KHUB_FUZZ_PLUGINS:-$SRC/build}"
if [ -d "$PLUGINS" ]; then
    find "$PLUGINS/plugins" "$PLUGINS/test-plugins" -name '*.so' -size -4M 2>/dev/null |
        while read -r so; do
            out="$CORPUS/elf/$(echo "${so#"$PLUGINS"/}" | tr / _)"
            strip -s -o "$out" "$so" 2>/dev/null || cp "$so" "$out"
        done
fi
cp /bin/true "$CORPUS/elf/an-executable" 2>/dev/null || true # an ELF, but no plugin
# prompts: plain lines, JSON lines with every setting, and bad lines
printf 'the cat sat\n\n{"prompt":"a b","max_tokens":4,"ignore_eos":true}\n' > "$CORPUS/prompts/s1"
printf '{"prompt":"x","temperature":0.9,"top_k":40,"seed":7,"top_p":0.5,"repeat_penalty":1.1}\n{"prompt":"y","chat":true,"system":"be brief","stop":["e","f"]}\n{"prompt":"z","stop":"q"}\r\n' \
    > "$CORPUS/prompts/s2"
printf '{"prompt":"bad",\n{"max_tokens":0}\n{"prompt":"a","nope":1}\n' > "$CORPUS/prompts/s3"
# requests: the first byte picks the parser (see fuzz_requests.c)
req_seed() { { printf "\\$(printf '%03o' "$1")"; cat; } > "$CORPUS/requests/seed-$1-$2"; }
printf '{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":" there"}]}],"max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":3,"stream":true,"stream_options":{"include_usage":true},"stop":["a","b"]}' \
    | req_seed 0 chat
printf '{"model":"m","prompt":"once upon","max_completion_tokens":4,"n":1,"stop":"x"}' | req_seed 1 completion
printf '{"prompt":["one"],"seed":-5,"temperature":null}' | req_seed 1 completion-array
printf 'HTTP/1.1 302 Found\r\nLocation: https://cdn.example/x?a=b\r\nETag: W/"abc"\r\nX-Repo-Commit: %s\r\nX-Linked-Etag: "deadbeef"\r\nX-Linked-Size: 1234\r\nContent-Length: 12\r\nContent-Range: bytes 10-20/30\r\nRetry-After: 5\r\nRateLimit: "api";r=0;t=55\r\nX-Error-Code: RepoNotFound\r\nX-Error-Message: no such repo\r\nLink: <https://h/api?cursor=x>; rel="next"\r\n\r\n' \
    $C | req_seed 2 headers
printf '"api";r=0;t=55' | req_seed 3 ratelimit
req_seed 4 chatml-template << 'T'
{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'}}{% endfor %}{{ '<|im_start|>system\nBe kind.<|im_end|>' }}
T
req_seed 4 llama3-template << 'T'
{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}
T
req_seed 4 gemma-template << 'T'
{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + '<end_of_turn>' }}{% endfor %}
T

cd "$BUILD"
for t in $TARGETS; do
    max_len=65536
    [ "$t" = elf ] && max_len=1048576 # a plugin seed is up to ~650 KB stripped
    echo "fuzz_$t: ${SECS}s"
    set +e
    "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECS" -max_len="$max_len" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "$CORPUS/$t" 2>&1 | tail -n 12
    # PIPESTATUS: the fuzzer's own exit status, not tail's
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then
        echo "fuzz_$t: FAILED (exit $rc); reproducer in $BUILD/crash-*" >&2
        exit "$rc"
    fi
done
echo "all fuzz targets ran ${SECS}s each without a failure"
