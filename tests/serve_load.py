"""serve_load.py: the load test of `khub serve-model` with live kernel
reloads (issue 16 item 6), driven by the `openai` client (nobody here wrote
it); used by tests/t_serve_reload.sh (tiny Gemma, fast) and
tests/t_serve_reload_hub.sh (SmolLM2 with Hub kernels, slow).

    python3 serve_load.py BASE KEY --clients 32 --requests 4 --max-tokens 24 \\
        --reload attention=kernels-community/flash-attn2@v2 [--reload ...] \\
        [--refuse attention=acme/tampered:422:SIGNATURE_INVALID] [--mode chat]

First every distinct prompt runs alone, greedy and not streamed: its text is
the reference. Then CLIENTS threads each stream REQUESTS requests (prompt
(client * REQUESTS + i) % len(PROMPTS)) while the main thread, once an
eighth of all requests are streaming or done, posts the --reload swaps
(and --refuse ones, which must be refused with that status and code) one
after the other, each while requests are in flight. Every streamed text must
equal its prompt's solo text, with a finish reason, usage whose
completion_tokens equals the solo answer's, and no error; nothing may be
lost (all CLIENTS * REQUESTS requests answer) within --deadline seconds.
Prints one summary line; exits 1 with the reasons on any failure.
"""
import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

PROMPTS = [
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write one sentence about the sea.",
    "What is 12 times 12?",
    "Give a synonym for happy.",
    "Which planet is the largest?",
    "Say hello in Spanish.",
    "What do bees make?",
]


def post(base, key, path, body):
    """(status, parsed JSON) of a POST."""
    rq = urllib.request.Request(base + path, json.dumps(body).encode(),
                                {"Authorization": "Bearer " + key,
                                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def metric_lines(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return [l for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " ")]


class Load:
    def __init__(self, a):
        self.a = a
        self.c = openai.OpenAI(base_url=a.base + "/v1", api_key=a.key, max_retries=0,
                               timeout=a.deadline)
        self.lock = threading.Lock()
        self.started = self.done = 0
        self.failures = []
        self.solo = {}

    def ask(self, prompt, stream):
        kw = dict(model="m", max_tokens=self.a.max_tokens, temperature=0)
        if self.a.mode == "chat":
            kw["messages"] = [{"role": "user", "content": prompt}]
            create = self.c.chat.completions.create
        else:
            kw["prompt"] = prompt
            create = self.c.completions.create
        if not stream:
            r = create(**kw)
            ch = r.choices[0]
            return (ch.message.content if self.a.mode == "chat" else ch.text,
                    ch.finish_reason, r.usage.completion_tokens)
        parts, finish, usage = [], None, None
        first = True
        for ev in create(stream=True, stream_options={"include_usage": True}, **kw):
            if ev.usage:
                usage = ev.usage.completion_tokens
            for ch in ev.choices:
                piece = ch.delta.content if self.a.mode == "chat" else ch.text
                if piece:
                    parts.append(piece)
                    if first:
                        first = False
                        with self.lock:
                            self.started += 1
                if ch.finish_reason:
                    finish = ch.finish_reason
        return "".join(parts), finish, usage

    def client(self, k):
        for i in range(self.a.requests):
            p = PROMPTS[(k * self.a.requests + i) % len(PROMPTS)]
            try:
                got = self.ask(p, True)
                if got != self.solo[p]:
                    self.fail("client %d request %d (%r): streamed %r, alone %r"
                              % (k, i, p, got, self.solo[p]))
            except Exception as e:  # a lost or refused request
                self.fail("client %d request %d (%r): %s: %s" % (k, i, p, type(e).__name__, e))
            with self.lock:
                self.done += 1

    def fail(self, msg):
        with self.lock:
            self.failures.append(msg)

    def in_flight(self):
        with self.lock:
            return self.started - min(self.started, self.done), self.done

    def swaps(self, total):
        """Posts every --reload and --refuse while requests are in flight."""
        t0 = time.time()
        while True:
            with self.lock:
                if self.started + self.done >= total // 8 or self.done >= total:
                    break
            if time.time() - t0 > self.a.deadline:
                return self.fail("the load never started streaming")
            time.sleep(0.02)
        log = []
        for spec in self.a.reload + self.a.refuse:
            role, rest = spec.split("=", 1)
            want = None
            if spec in self.a.refuse:
                name, status, code = rest.rsplit(":", 2)
                want = (int(status), code)
            else:
                name = rest
            busy, done = self.in_flight()
            while busy == 0 and done < total and time.time() - t0 < self.a.deadline:
                time.sleep(0.005)  # between two waves: wait for the next
                busy, done = self.in_flight()
            t = time.time()
            st, body = post(self.a.base, self.a.key, "/v1/kernels/reload",
                            {"role": role, "kernel": name})
            ms = (time.time() - t) * 1000
            if want is None and st != 200:
                self.fail("reload %s=%s: %d %s" % (role, name, st, body))
            elif want is not None and (st != want[0] or body["error"]["code"] != want[1]):
                self.fail("refusal %s=%s: want %d %s, got %d %s"
                          % (role, name, want[0], want[1], st, body))
            if busy == 0:
                self.fail("reload %s=%s: no request was in flight (done %d)" % (role, name, done))
            what = ("%s; prepared in %s ms, switched %s ms later"
                    % (body.get("binding"), body.get("prepare_ms"), body.get("switch_ms"))
                    if st == 200 else body["error"]["code"])
            log.append("%s=%s %d (%s) in %.0f ms with %d in flight, %d done"
                       % (role, name, st, what, ms, busy, done))
            time.sleep(self.a.gap)
        self.log = log

    def run(self):
        for p in PROMPTS:
            self.solo[p] = self.ask(p, False)
            if not self.solo[p][0] or not self.solo[p][1]:
                self.fail("solo %r: %r" % (p, self.solo[p]))
        total = self.a.clients * self.a.requests
        t0 = time.time()
        ts = [threading.Thread(target=self.client, args=(k,), daemon=True)
              for k in range(self.a.clients)]
        for t in ts:
            t.start()
        self.log = []
        self.swaps(total)
        for t in ts:
            t.join(max(0.1, self.a.deadline - (time.time() - t0)))
        wall = time.time() - t0
        if any(t.is_alive() for t in ts):
            self.fail("past the %d s deadline: %d of %d requests answered"
                      % (self.a.deadline, self.done, total))
        elif self.done != total:
            self.fail("%d of %d requests answered" % (self.done, total))
        for line in self.log:
            print("reload", line)
        for line in metric_lines(self.a.base, "khub_kernel_calls_total"):
            if 'role="attention"' in line or 'role="paged_attention"' in line:
                print("metric", line)
        if self.failures:
            for f in self.failures[:20]:
                print("FAIL:", f)
            print("FAIL: %d failures" % len(self.failures))
            return 1
        print("ok   %d clients x %d streamed requests in %.1f s, every text equal to its solo run, "
              "%d reloads and %d refusals in flight"
              % (self.a.clients, self.a.requests, wall, len(self.a.reload), len(self.a.refuse)))
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("key")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--mode", choices=["chat", "completion"], default="chat")
    ap.add_argument("--reload", action="append", default=[])
    ap.add_argument("--refuse", action="append", default=[])
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between swaps")
    ap.add_argument("--deadline", type=int, default=600)
    a = ap.parse_args()
    a.base = a.base.rstrip("/")
    return Load(a).run()


if __name__ == "__main__":
    sys.exit(main())
