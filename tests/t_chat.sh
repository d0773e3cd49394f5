#!/usr/bin/env bash
# t_chat.sh: `khub chat` (issue 16 item 5) driven through a pseudo-terminal
# (Python's pty module: the chat's terminal is a real tty, so Ctrl-C and
# Ctrl-D go through the line discipline as they do for a person) on the tiny
# random Llama with SmolLM2's tokenizer and template (tools/make-tiny-model.py).
#
# Session 1: two turns (turn 1's answer equals `khub run --chat` of the same
# message), /save, /clear, /load of the saved file and /save again (the same
# file), /stats (turn 2 reused turn 1's cache), a third turn, a row of bad /load files (each refused with its
# reason, the conversation unchanged), an unknown command, /help, /system,
# and Ctrl-D at the prompt (exit 0).
# Session 2: Ctrl-C while a long answer streams (the answer stops, the
# partial answer stays in the conversation), another turn stopped the same
# way, then Ctrl-C at the prompt (exit 130, as llama-cli).
# Session 2b: Ctrl-C while a long system prompt is prefilled: the turn stops
# before its answer with part of the prompt computed, the message is not
# added.
# Session 3: a 128-token context: the usage note near the end, a message that
# does not fit (refused with the numbers, not added), an answer that fills
# the context (stops and says so).
# Also `khub run --prompt -` (standard input) and the chat's usage errors.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin chat
command -v python3 > /dev/null || t_skip "python3 absent"
python3 "$SRC/tools/make-tiny-model.py" tiny > /dev/null

# ---- khub run --prompt - ------------------------------------------------
"$KHUB" run --model tiny --prompt "The capital of France is" --max-new-tokens 8 > arg.txt 2> /dev/null
echo "The capital of France is" |
    "$KHUB" run --model tiny --prompt - --max-new-tokens 8 > stdin.txt 2> /dev/null
cmp arg.txt stdin.txt || fail "--prompt - differs from --prompt TEXT: $(cat stdin.txt) vs $(cat arg.txt)"
[ -s arg.txt ] || fail "khub run printed nothing"
rc=0
printf 'a\0b' | "$KHUB" run --model tiny --prompt - > out.txt 2> err.txt || rc=$?
[ "$rc" = 1 ] || fail "a NUL byte on stdin: exit $rc"
grep -q "khub run: --prompt -: standard input holds a NUL byte" err.txt || fail "NUL: $(cat err.txt)"
rc=0
"$KHUB" run --model tiny --prompt - --prompt - < /dev/null > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] || fail "two --prompt -: exit $rc"
grep -q -- "--prompt - (standard input) at most once" err.txt || fail "two -: $(cat err.txt)"

# ---- usage ----------------------------------------------------------------
"$KHUB" chat --help > help.txt
grep -q "usage: khub chat --model PATH" help.txt || fail "chat --help: $(cat help.txt)"
# Each command's help states its own default answer length (chat's is 1024).
grep -qx "  --max-new-tokens N    tokens to generate per answer (default 1024)" help.txt ||
    fail "chat --help's --max-new-tokens: $(grep -A1 -- --max-new-tokens help.txt)"
"$KHUB" run --help > run_help.txt
grep -qx "  --max-new-tokens N    tokens to generate per answer (default 128)" run_help.txt ||
    fail "run --help's --max-new-tokens: $(grep -- --max-new-tokens run_help.txt)"
"$KHUB" --help > help.txt
grep -q "^  chat  " help.txt || fail "khub --help does not list chat"
rc=0
"$KHUB" chat > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q -- "--model PATH is required" err.txt || fail "no --model: $rc $(cat err.txt)"
rc=0
"$KHUB" chat --model tiny --prompt x > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "unknown option '--prompt'" err.txt || fail "bad flag: $rc $(cat err.txt)"

# ---- the sessions, through a pty -------------------------------------------
python3 - "$KHUB" tiny << 'PY'
import json, os, pty, re, select, subprocess, sys, time

KHUB, MODEL = sys.argv[1], sys.argv[2]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Chat:
    """khub chat on a pty: send lines, wait for patterns."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(KHUB, [KHUB, "chat", "--model", MODEL, *args])
        self.buf = b""
        self.ready = False  # the input prompt was seen: khub waits for a line

    def until(self, pat, timeout=120):
        """Reads until pat matches; returns the text up to the match's end."""
        rx = re.compile(pat.encode(), re.S)
        end = time.time() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[: m.end()], self.buf[m.end() :]
                return out.decode("utf-8", "replace")
            left = end - time.time()
            if left <= 0:
                fail("waited %ds for %r; the terminal shows %r" % (timeout, pat, self.buf[-1500:]))
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    fail("khub chat ended while waiting for %r: %r" % (pat, self.buf[-1500:]))
                self.buf += data

    def prompt(self):
        """Waits for the input prompt at the end of the output so far."""
        out = self.until(r"> \Z")
        self.ready = True
        return out

    def send(self, line):
        """Types line once khub waits for one (typed earlier, the echo would
        mix with khub's output)."""
        if not self.ready:
            self.prompt()
        self.ready = False
        os.write(self.fd, line.encode() + b"\r")
        self.until(re.escape(line.splitlines()[-1]) + r"\r\n")  # the terminal's echo

    def turn(self, line):
        self.send(line)
        return self.prompt()

    def key(self, k):
        """Types a control key (Ctrl-C, Ctrl-D) at the prompt."""
        if not self.ready:
            self.prompt()
        self.ready = False
        os.write(self.fd, k)

    def exit_status(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            try:  # drain, so the program never blocks on a full terminal
                if select.select([self.fd], [], [], 0.05)[0]:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                pass
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(st)
        fail("khub chat did not exit: %r" % self.buf[-1500:])


def messages(path):
    with open(path) as f:
        return json.load(f)["messages"]


# ---- session 1 ----
c = Chat("--max-new-tokens", "8")
c.until(r"khub chat: tiny, context 512 tokens\. /help lists the commands")
c.prompt()
c.send("/stats")
c.until(r"\[no turn yet\]")
STATS = (r"\[last turn: prompt (\d+) tokens \((\d+) reused from the cache, (\d+) computed in "
         r"[\d.]+ ms\); answer (\d+) tokens in [\d.]+ ms \([\d.]+ tok/s\); cache (\d+) of 512 tokens\]")


def stats():
    c.send("/stats")
    return [int(x) for x in re.search(STATS, c.until(STATS)).groups()]


c.turn("Hello")
p1, r1, c1, n1, k1 = stats()
c.turn("How are you?")
p2, r2, c2, n2, k2 = stats()
# Turn 2 reuses all turn 1 cached, but maybe its last token (BPE may merge the
# template's newline with the answer's first characters: docs/chat.md).
if r1 != 0 or c1 != p1 or r2 < k1 - 1 or r2 + c2 != p2 or k2 != p2 + n2 - (n2 == 8):
    fail("/stats: turn 1 %r, turn 2 %r" % ((p1, r1, c1, n1, k1), (p2, r2, c2, n2, k2)))
c.send("/save s1.json")
c.until(r"\[saved 4 messages to s1\.json\]")
c.prompt()
m1 = messages("s1.json")
if [m["role"] for m in m1] != ["user", "assistant", "user", "assistant"]:
    fail("s1.json roles: %r" % m1)
if m1[0]["content"] != "Hello" or m1[2]["content"] != "How are you?":
    fail("s1.json contents: %r" % m1)
ref = subprocess.run([KHUB, "run", "--model", MODEL, "--chat", "--prompt", "Hello",
                      "--max-new-tokens", "8"], capture_output=True, text=True, check=True)
if ref.stdout[:-1] != m1[1]["content"]:
    fail("turn 1 %r, khub run --chat %r" % (m1[1]["content"], ref.stdout))
c.send("/clear")
c.until(r"\[conversation cleared\]")
c.turn("/save s2.json")
if messages("s2.json") != []:
    fail("after /clear: %r" % messages("s2.json"))
c.send("/load s1.json")
c.until(r"\[loaded 4 messages from s1\.json\]")
c.turn("/save s3.json")
if messages("s3.json") != m1:
    fail("/load then /save: %r, want %r" % (messages("s3.json"), m1))
c.turn("And then?")
c.turn("/save s4.json")
m4 = messages("s4.json")
if len(m4) != 6 or m4[:4] != m1 or m4[4]["content"] != "And then?":
    fail("s4.json: %r" % m4)

# Bad files: each refused with its reason; the conversation stays.
with open("nul.json", "wb") as f:
    f.write(b'{"messages": [\x00]}')
bad = {
    "missing.json": None,
    "syntax.json": '{"messages": [',
    "role.json": '[{"role": "robot", "content": "x"}]',
    "content.json": '[{"role": "user", "content": "x"}, {"role": "assistant", "content": 7}]',
    "system.json": '[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]',
    "empty.json": "[]",
    "shape.json": '{"msgs": []}',
    "item.json": '["hello"]',
    "utf8.json": b'[{"role": "user", "content": "a\xff"}]',
}
for name, body in bad.items():
    if body is not None:
        with open(name, "wb") as f:
            f.write(body if isinstance(body, bytes) else body.encode())
want = {
    "missing.json": "No such file or directory",
    "syntax.json": "not JSON: a syntax error at byte 14 of 14",
    "role.json": 'message 0: role "robot" is not system, user or assistant',
    "content.json": 'message 1: "content" is missing or not a string',
    "system.json": "message 1: a system message may only come first",
    "empty.json": "it holds no messages",
    "shape.json": r'want \{"messages": \[\.\.\.\]\} or an array of messages',
    "item.json": r'message 0 is not an object \{"role", "content"\}',
    "utf8.json": r"message 0: content is not valid UTF-8 \(byte 1\)",
    "nul.json": r"it holds a NUL byte at offset 14 \(not a JSON text file\)",
    ".": r"cannot read it \(a folder\?\)",
}
for name, reason in want.items():
    c.send("/load " + name)
    c.until(r"khub chat: /load %s: %s; the conversation is unchanged" % (re.escape(name), reason))
    c.prompt()
c.turn("/save s5.json")
if messages("s5.json") != m4:
    fail("bad /load files changed the conversation: %r" % messages("s5.json"))
c.send("/frobnicate now")
c.until(r"khub chat: unknown command /frobnicate \(/help lists them\)")
c.prompt()
c.send("/help")
c.until(r"/system TEXT  set the system prompt.*/load FILE")
c.prompt()
c.send("/save")
c.until(r"khub chat: /save needs a FILE")
c.prompt()
c.send("/system Be brief.")
c.until(r"\[system prompt set; conversation restarted\]")
c.prompt()
c.send("/system")
c.until(r"\[system prompt: Be brief\.\]")
c.prompt()
c.turn("Hi")
c.turn("/save s6.json")
m6 = messages("s6.json")
if [m["role"] for m in m6] != ["system", "user", "assistant"] or m6[0]["content"] != "Be brief.":
    fail("after /system: %r" % m6)
c.key(b"\x04")  # Ctrl-D at the prompt
st = c.exit_status()
if st != 0:
    fail("Ctrl-D: exit %d; the terminal shows %r" % (st, c.buf[-3000:]))

# ---- session 2: Ctrl-C ----
# A 16384-token context (past the tiny model's trained 512: a warning) and no
# EOS: an answer runs for seconds unless it is stopped.
c = Chat("--max-new-tokens", "100000", "--ignore-eos", "--max-context", "16384")
c.prompt()
for n, line in enumerate(["Tell me a long story.", "Go on."]):
    c.send(line)
    c.until(r".")  # the answer's first bytes
    os.write(c.fd, b"\x03")  # Ctrl-C while the answer streams
    c.until(r"\[stopped: the partial answer stays in the conversation\]")
    c.prompt()
    c.turn("/save p%d.json" % n)
    mp = messages("p%d.json" % n)
    if len(mp) != 2 * n + 2 or mp[-1]["role"] != "assistant" or not mp[-1]["content"]:
        fail("after Ctrl-C: %r" % mp)
if "context full" in c.buf.decode("utf-8", "replace"):
    fail("the answers were not stopped by Ctrl-C")
c.key(b"\x03")  # Ctrl-C at the prompt leaves, as llama-cli
st = c.exit_status()
if st != 130:
    fail("Ctrl-C at the prompt: exit %d, want 130; the terminal shows %r" % (st, c.buf[-3000:]))

# ---- session 2b: Ctrl-C while the prompt is computed ----
# A system prompt of about 7800 tokens through khub/ref-cpu's attention in
# chunks of 64: some 8 s of prefill on an idle core (more under the
# sanitizers) before the first answer token, so a Ctrl-C half a second in
# lands in the prefill. khub_session_cancel stops it within one chunk; the
# message is taken back.
c = Chat("--system", "seven green apples " * 600, "--max-context", "16384",
         "--max-batch-tokens", "64", "--attn", "khub/ref-cpu", "--linear", "khub/ref-cpu",
         "--max-new-tokens", "4")
c.prompt()
c.send("Hi")
time.sleep(0.5)
t0 = time.time()
os.write(c.fd, b"\x03")  # Ctrl-C during the prefill
out = c.until(r"\[stopped before the answer began \((\d+) of the prompt's (\d+) tokens "
              r"computed\): the message was not added\]")
took = time.time() - t0
done, total = map(int, re.search(r"\((\d+) of the prompt's (\d+)", out).groups())
if not (0 < done < total - 1 and total > 7000):
    fail("Ctrl-C in the prefill: %d of %d tokens computed" % (done, total))
c.prompt()
c.turn("/save s2b.json")
if [m["role"] for m in messages("s2b.json")] != ["system"]:
    fail("the cancelled message was kept: %r" % messages("s2b.json"))
print("Ctrl-C in the prefill: stopped %.2f s after the key, %d of %d prompt tokens computed"
      % (took, done, total))
c.key(b"\x03")
st = c.exit_status()
if st != 130:
    fail("Ctrl-C at the prompt after a cancelled prefill: exit %d" % st)

# ---- session 3: a 128-token context ----
c = Chat("--max-context", "128", "--max-new-tokens", "30", "--ignore-eos")
c.prompt()
c.send("Hi")
c.until(r"\[context: \d+ of 128 tokens used \(\d+%\)\]")
c.prompt()
c.send("Please go on and tell me much more about it.")
c.until(r"\[context full: khub_session_generate: the prompt has \d+ tokens; the KV cache holds "
        r"128 per sequence \(raise max_context\)\. The message was not added")
c.prompt()
c.turn("/save c1.json")
if len(messages("c1.json")) != 2:
    fail("a refused message was added: %r" % messages("c1.json"))
c.send("/clear")
c.prompt()
c.send("one two three four five six seven eight nine ten eleven twelve")
c.until(r"\[context full: 128 of 128 tokens; the answer stops here\.")
c.key(b"\x04")
st = c.exit_status()
if st != 0:
    fail("Ctrl-D after a full context: exit %d; the terminal shows %r" % (st, c.buf[-3000:]))
print("ok      chat: 4 sessions through a pty")
PY
echo "1 passed, 0 failed, 0 skipped"
