#!/usr/bin/env bash
# t_model_server.sh: `khub serve-model` (docs/model-server.md) on the real
# SmolLM2-135M-Instruct GGUF, on loopback, through clients nobody here
# wrote: the `openai` Python package (chat greedy "Paris", streaming whose
# chunks join into the plain answer, completions, models, usage, errors as
# the client's exception classes with their statuses) and curl (SSE format
# and [DONE], include_usage, health, metrics, kernels, hostile input:
# malformed JSON, wrong types, duplicate keys, empty messages, n=2, a prompt
# longer than the context with the numbers, an oversized body, 10k headers,
# a silent connection closed by the timeout, a full queue answered 503 with
# Retry-After, a client that hangs up mid-stream cancels its request). After
# the attacks the server still answers. Skips when the model is absent.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
command -v curl > /dev/null || t_skip "curl is not installed"
t_begin model_server
KEY=test-key-123

# Usage errors come before any model is loaded.
set +e
"$KHUB" serve-model > u.out 2> u.err
rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--model PATH is required" u.err || fail "no --model: rc $rc $(cat u.err)"
set +e
"$KHUB" serve-model --model "$GGUF" --host 300.1.2.3 --port 0 > h.out 2> h.err
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "is not an IPv4 address" h.err || fail "bad host: rc $rc $(cat h.err)"
set +e
"$KHUB" serve-model --model "$GGUF" --temperature 0.7 > t.out 2> t.err
rc=$?
set -e
[ $rc -eq 2 ] && grep -qx "khub serve-model: --temperature is set per request (in the request's body), not for the server" t.err ||
    fail "sampling flag: rc $rc $(cat t.err)"
echo "ok   usage errors: no --model (2), a sampling flag (2), a bad --host (1)"

"$KHUB" serve-model --model "$GGUF" --model-id smollm2 --port 0 --threads 2 --api-key "$KEY" \
    --max-queue 3 --parallel 2 --timeout 3 --max-context 512 > srv.out 2> srv.err &
SRV=$!
for _ in $(seq 300); do
    grep -q http srv.out 2> /dev/null && break
    kill -0 $SRV 2> /dev/null || fail "serve-model exited: $(cat srv.err)"
    sleep 0.1
done
BASE=$(grep -o 'http://[0-9.:]*' srv.out | head -n 1 || true)
[ -n "$BASE" ] || fail "serve-model printed no address: $(cat srv.out srv.err)"
grep -q "(API key required)" srv.out || fail "banner: $(cat srv.out)"
AUTH="Authorization: Bearer $KEY"
echo "ok   serving at $BASE"

# post PATH BODY: curl with the key; prints the body then the status.
post() { curl -s -H "$AUTH" -H "Content-Type: application/json" -w '\n%{http_code}' "$BASE$1" -d "$2"; }
# expect STATUS PATTERN PATH BODY
expect() {
    local out
    out=$(post "$3" "$4")
    [ "$(tail -n 1 <<< "$out")" = "$1" ] || fail "$3 $4: want $1, got: $out"
    grep -q -- "$2" <<< "$out" || fail "$3 $4: want /$2/ in: $out"
}
health() { [ "$(curl -s "$BASE/health")" = '{"status":"ok"}' ] || fail "health after $1"; }

# --- the openai client ----------------------------------------------------
if python3 -c "import openai" 2> /dev/null; then
    BASE=$BASE KEY=$KEY python3 - << 'EOF' || fail "openai client checks (above)"
import os, openai
base, key = os.environ["BASE"] + "/v1", os.environ["KEY"]
c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
q = [{"role": "user", "content": "What is the capital of France?"}]
r = c.chat.completions.create(model="smollm2", messages=q, max_tokens=16, temperature=0)
text = r.choices[0].message.content
assert "Paris" in text, text
assert r.object == "chat.completion" and r.model == "smollm2", r
assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
u = r.usage
assert u.prompt_tokens > 0 and u.completion_tokens > 0, u
assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
print("ok   openai chat:", repr(text), "usage", u.prompt_tokens, u.completion_tokens)

parts, usage, finish = [], None, None
for ch in c.chat.completions.create(model="smollm2", messages=q, max_tokens=16, temperature=0,
                                    stream=True, stream_options={"include_usage": True}):
    if ch.usage: usage = ch.usage
    for cc in ch.choices:
        if cc.delta.content: parts.append(cc.delta.content)
        if cc.finish_reason: finish = cc.finish_reason
assert "".join(parts) == text, ("stream", parts, text)
assert usage and usage.completion_tokens == u.completion_tokens, usage
assert finish == r.choices[0].finish_reason, finish
print("ok   openai stream: %d chunks join into the same text, usage and finish" % len(parts))

r = c.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6,
                         temperature=0)
assert "Paris" in r.choices[0].text and r.usage.prompt_tokens == 5, r
print("ok   openai completions:", repr(r.choices[0].text))

ms = c.models.list().data
assert [m.id for m in ms] == ["smollm2"], ms
assert c.models.retrieve("smollm2").id == "smollm2"
try:
    c.models.retrieve("gpt-4"); raise SystemExit("FAIL: unknown model retrieved")
except openai.NotFoundError as e:
    assert e.status_code == 404
print("ok   openai models: list, retrieve, unknown is NotFoundError")

def refused(cls, status, words, **kw):
    try:
        (kw.pop("client", c)).chat.completions.create(**kw)
    except cls as e:
        assert e.status_code == status, (e.status_code, e)
        for w in words: assert w in str(e), (w, str(e))
        return
    raise SystemExit("FAIL: not refused: %r" % kw)

bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
refused(openai.AuthenticationError, 401, ["API key"], client=bad, model="m", messages=q)
refused(openai.BadRequestError, 400, ["'n' must be 1"], model="m", messages=q, n=2)
refused(openai.BadRequestError, 400, ["at least one message"], model="m", messages=[])
refused(openai.BadRequestError, 400, ["maximum context length is 512 tokens",
                                      "37 prompt tokens", "asks for 600"],
        model="m", messages=q, max_tokens=600)
refused(openai.BadRequestError, 400, ["temperature"], model="m", messages=q, temperature=3)
print("ok   openai errors: 401 wrong key, 400 n=2, empty messages, context (numbers), range")
EOF
else
    echo "skip openai client: the openai package is absent (tools/install-test-deps.sh)"
fi

# --- curl: the wire format ---------------------------------------------------
Q='"messages":[{"role":"user","content":"What is the capital of France?"}]'
curl -sN -H "$AUTH" "$BASE/v1/chat/completions" \
    -d "{$Q,\"max_tokens\":4,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"unknown_field\":{\"x\":[1]}}" > sse.txt
grep -q '^data: {.*"delta":{"role":"assistant","content":""}' sse.txt || fail "no role chunk: $(cat sse.txt)"
grep -q '"finish_reason":"length"' sse.txt || fail "no finish chunk: $(cat sse.txt)"
grep '"usage":{"prompt_tokens":37,"completion_tokens":4,"total_tokens":41}' sse.txt | grep '"choices":\[\]' > /dev/null ||
    fail "no usage chunk: $(cat sse.txt)"
[ "$(tail -n 2 sse.txt | head -n 1)" = "data: [DONE]" ] || fail "no final [DONE]: $(tail -n 3 sse.txt)"
[ "$(grep -c '^data: ' sse.txt)" -eq 8 ] || fail "want 8 events (role, 4 text, finish, usage, DONE): $(cat sse.txt)"
echo "ok   SSE: role chunk, 4 text chunks, finish, usage, [DONE]; an unknown field ignored"

curl -s -H "$AUTH" "$BASE/v1/kernels" | python3 -c '
import json, sys
k = json.load(sys.stdin)
roles = {e["role"]: e["binding"] for e in k["data"]}
# a server batches, so with no cache or attention named it runs on the paged pool
assert any(r.startswith("paged_attention") for r in roles), roles
assert roles.get("kv_cache[f32]", "").endswith(":: paged_cache"), roles
assert all(" :: " in b for b in roles.values()), roles
' || fail "kernels: $(curl -s -H "$AUTH" "$BASE/v1/kernels" | head -c 400)"
curl -s "$BASE/metrics" > m.txt
for m in http_requests_total completions_total prompt_tokens_total generated_tokens_total \
    queue_depth batch_size kv_tokens_used kv_tokens_capacity; do
    grep -q "^# TYPE khub_$m " m.txt && grep -Eq "^khub_$m [0-9]+$" m.txt || fail "metric $m: $(cat m.txt)"
done
grep -q "^khub_kv_tokens_capacity 1024$" m.txt || fail "kv capacity (2 x 512): $(cat m.txt)"
echo "ok   kernels (a role per binding), metrics (Prometheus text), health"

# --- hostile input --------------------------------------------------------------
C=/v1/chat/completions
out=$(curl -s -w '\n%{http_code}' "$BASE$C" -d "{$Q}")
[ "$(tail -n 1 <<< "$out")" = 401 ] && grep -q "Incorrect or missing API key" <<< "$out" || fail "no key: $out"
out=$(curl -s -H "Authorization: Bearer $KEY-" -w '\n%{http_code}' "$BASE/v1/models")
[ "$(tail -n 1 <<< "$out")" = 401 ] || fail "wrong key: $out"
expect 400 "not valid JSON" "$C" '{"messages": ['
expect 400 'duplicate key' "$C" "{$Q,\"max_tokens\":2,\"max_tokens\":3}"
expect 400 "text after the JSON document" "$C" "{$Q} {}"
expect 400 "must be a JSON object" "$C" '[1,2]'
expect 400 '"param":"messages"' "$C" '{"messages":"hello"}'
expect 400 "non-empty string 'role'" "$C" '{"messages":[{"content":"hi"}]}'
expect 400 "needs a 'content'" "$C" '{"messages":[{"role":"user"}]}'
expect 400 "only {" "$C" '{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}'
expect 400 "'max_tokens' must be an integer" "$C" "{$Q,\"max_tokens\":1.5}"
expect 400 "'stream' must be a boolean" "$C" "{$Q,\"stream\":\"yes\"}"
expect 400 "'stop' must be a string or an array of up to 4" "$C" "{$Q,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}"
expect 400 "'prompt' must not be empty" /v1/completions '{"prompt":""}'
expect 400 "token arrays" /v1/completions '{"prompt":[1,2,3]}'
python3 -c "print('{\"prompt\":\"' + 'hello ' * 600 + '\",\"max_tokens\":4}')" > long.json
out=$(curl -s -H "$AUTH" -w '\n%{http_code}' "$BASE/v1/completions" --data-binary @long.json)
grep -q "maximum context length is 512 tokens; the request has 601 prompt tokens and asks for 4" <<< "$out" &&
    [ "$(tail -n 1 <<< "$out")" = 400 ] || fail "long prompt: $out"
out=$(curl -s -H "$AUTH" -w '\n%{http_code}' "$BASE/v1/nope")
[ "$(tail -n 1 <<< "$out")" = 404 ] && grep -q "no endpoint GET /v1/nope" <<< "$out" || fail "404: $out"
out=$(curl -s -H "$AUTH" -w '\n%{http_code}' -X DELETE "$BASE/v1/models")
[ "$(tail -n 1 <<< "$out")" = 405 ] || fail "405: $out"
head -c 1100000 /dev/zero | tr '\0' a > big.txt
out=$(curl -s -H "$AUTH" -w '\n%{http_code}' "$BASE$C" --data-binary @big.txt)
[ "$(tail -n 1 <<< "$out")" = 413 ] && grep -q "1100000 bytes is over the server's limit of 1048576" <<< "$out" ||
    fail "413: $(head -c 300 <<< "$out")"
health "the bad bodies"
echo "ok   hostile bodies: 401, malformed/duplicate/trailing JSON, wrong types, 404, 405, 413, context"

python3 - "$BASE" << 'EOF' || fail "10k headers (above)"
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port), timeout=10)
req = "GET /health HTTP/1.1\r\nHost: x\r\n" + "".join("X-H%d: v\r\n" % i for i in range(10000)) + "\r\n"
try:
    s.sendall(req.encode())
    got = s.recv(200).decode(errors="replace")
except (BrokenPipeError, ConnectionResetError):
    got = ""
assert got == "" or got.split()[1] in ("413", "431", "400"), got[:100]
print("ok   10k headers: refused (%s)" % (got.split("\r\n")[0] or "connection closed"))
EOF
exec 3<> "/dev/tcp/127.0.0.1/${BASE##*:}"
t0=$(date +%s)
health "a silent connection opened"
timeout 10 cat <&3 > /dev/null || true
exec 3<&-
t1=$(date +%s)
[ $((t1 - t0)) -le 8 ] || fail "a silent connection stayed open $((t1 - t0)) s (timeout 3)"
health "the slow client"
echo "ok   a silent connection is closed after the timeout ($((t1 - t0)) s); the server answers meanwhile"

# --- continuous batching: requests together give what each gives alone ----
BASE=$BASE KEY=$KEY python3 - << 'EOF' || fail "concurrent requests (above)"
import json, os, threading, urllib.request
def ask(content, out=None, i=0):
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 12,
                       "temperature": 0}).encode()
    rq = urllib.request.Request(os.environ["BASE"] + "/v1/chat/completions", body,
                                {"Authorization": "Bearer " + os.environ["KEY"]})
    r = json.load(urllib.request.urlopen(rq, timeout=300))["choices"][0]["message"]["content"]
    if out is not None: out[i] = r
    return r
qs = ["What is the capital of France?", "Name a color.", "What is 2+2?"]
alone = [ask(q) for q in qs]
together = [None] * 3
ts = [threading.Thread(target=ask, args=(q, together, i)) for i, q in enumerate(qs)]
for t in ts: t.start()
for t in ts: t.join()
assert together == alone, (together, alone)
print("ok   3 concurrent greedy requests (2 in the batch, 1 waiting) equal their solo runs")
EOF

# --- queue full and hang-ups ------------------------------------------------
metric() { curl -s "$BASE/metrics" | sed -n "s/^khub_$1 //p"; }
wait_metric() { # NAME VALUE: up to 30 s
    for _ in $(seq 300); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.1; done
    fail "metric $1 never became $2 (now $(metric "$1"))"
}
# A counting prompt goes on for all of its 400 tokens (seconds): a chat
# request "Count to 1000." answered "1000." in 5 tokens, so on a quiet
# machine some requests ended before their clients hung up.
LONG="{\"prompt\":\"1, 2, 3, 4, 5, 6, 7, 8, 9, 10,\",\"max_tokens\":400,\"temperature\":0"
CMP=/v1/completions
curl -sN -H "$AUTH" "$BASE$CMP" -d "$LONG,\"stream\":true}" > run1.txt &
C1=$!
curl -s -H "$AUTH" "$BASE$CMP" -d "$LONG}" > run2.txt &
C2=$!
wait_metric batch_size 2
for i in 3 4 5; do curl -s -H "$AUTH" "$BASE$CMP" -d "$LONG}" > run$i.txt & done
wait_metric queue_depth 3
curl -s -D hdr.txt -H "$AUTH" -o busy.json -w '%{http_code}' "$BASE$C" -d "{$Q}" > code.txt
[ "$(cat code.txt)" = 503 ] && grep -qi '^Retry-After: 1' hdr.txt && grep -q "queue of waiting requests is full" busy.json ||
    fail "queue full: $(cat code.txt hdr.txt busy.json)"
echo "ok   two requests share the running batch; three wait; a sixth: 503 with Retry-After"
for _ in $(seq 300); do grep -q '"text":"[^"]' run1.txt && break; sleep 0.1; done
grep -q '"text":"[^"]' run1.txt || fail "the stream sent no text: $(cat run1.txt)"
cancelled=$(metric cancelled_total)
kill $(jobs -p | grep -vx "$SRV")
for p in $(jobs -p | grep -vx "$SRV"); do wait "$p" 2> /dev/null || true; done
wait_metric cancelled_total $((cancelled + 5))
wait_metric batch_size 0
wait_metric queue_depth 0
wait_metric kv_tokens_used 0
expect 200 "Paris" "$C" "{$Q,\"max_tokens\":12,\"temperature\":0}"
echo "ok   five clients that hang up (streaming, plain, queued) are cancelled and their KV freed; the next request runs"

kill -TERM $SRV
wait $SRV 2> /dev/null || true
SRV=
grep -q "khub serve-model: stopped: [0-9]* requests" srv.err || fail "stop summary: $(cat srv.err)"
echo "ok   SIGTERM stops the server with a summary"
echo "passed"
