#!/usr/bin/env python3
"""serve_clients.py: N concurrent streaming clients against an OpenAI-style
/v1/completions endpoint (khub serve-model, llama-server, vLLM...), each
sending R requests one after another; prints one JSON line of totals.

    serve_clients.py --base http://127.0.0.1:8080 --clients 8 --requests 2 \
        --max-tokens 128

Every request is a greedy counting prompt ("Count: K, K+1, ..., K+9,"), a
different K per request and per run (--offset, default from the clock: a
server with a prompt cache, as llama-server has, must not find a prompt of
an earlier run), which SmolLM2-class models continue for hundreds of
tokens, so that every server generates the full --max-tokens without a
server-specific ignore_eos switch. Generated tokens are the usage the server
reports at the end of the stream (stream_options.include_usage); a server
that sends none is counted by its text chunks, and the line says which.

Measured per request: time to first token (request sent -> first non-empty
text chunk) and the inter-token latency (gaps between text chunks after the
first). Reported: wall time, requests/s, generated tokens/s (all tokens of
all requests / wall), TTFT p50/p99, ITL p50/p99, failures. Standard library
only.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def one_request(host, port, k, max_tokens, model, out):
    nums = ", ".join(str(k + i) for i in range(10))
    body = json.dumps({"model": model, "prompt": f"Count: {nums},", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        out["error"] = f"HTTP {resp.status}: {resp.read()[:200]!r}"
        return
    first = None
    last = None
    gaps = []
    chunks = 0
    usage = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            j = json.loads(data)
        except ValueError:
            continue
        if j.get("usage"):
            usage = j["usage"].get("completion_tokens")
        for c in j.get("choices") or []:
            if c.get("text"):
                now = time.perf_counter()
                chunks += 1
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    conn.close()
    end = time.perf_counter()
    if first is None:
        out["error"] = "no text"
        return
    out.update(ttft=first - t0, gaps=gaps, end=end,
               tokens=usage if usage is not None else chunks, by_usage=usage is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="http://HOST:PORT of the server")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1, help="requests per client, in turn")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="m")
    ap.add_argument("--label", default="")
    ap.add_argument("--offset", type=int, default=None,
                    help="first K of the counting prompts (default: from the clock)")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.base)
    offset = a.offset if a.offset is not None else int(time.time() * 1000) % 100000 * 10
    results = [[{} for _ in range(a.requests)] for _ in range(a.clients)]

    def client(c):
        for r in range(a.requests):
            one_request(u.hostname, u.port, offset + 37 * (c * a.requests + r), a.max_tokens, a.model,
                        results[c][r])

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    flat = [x for row in results for x in row]
    ok = [x for x in flat if "ttft" in x]
    gaps = [g for x in ok for g in x["gaps"]]
    tokens = sum(x["tokens"] for x in ok)
    print(json.dumps({
        "label": a.label, "offset": offset, "clients": a.clients, "requests": len(flat), "failed": len(flat) - len(ok),
        "errors": sorted({x["error"] for x in flat if "error" in x})[:3],
        "wall_s": round(wall, 3), "req_per_s": round(len(ok) / wall, 3),
        "gen_tok_per_s": round(tokens / wall, 2), "gen_tokens": tokens,
        "tokens_from_usage": all(x["by_usage"] for x in ok) if ok else False,
        "ttft_p50_ms": round(pct([x["ttft"] for x in ok], 50) * 1e3, 1),
        "ttft_p99_ms": round(pct([x["ttft"] for x in ok], 99) * 1e3, 1),
        "itl_p50_ms": round(pct(gaps, 50) * 1e3, 2),
        "itl_p99_ms": round(pct(gaps, 99) * 1e3, 2),
    }))


if __name__ == "__main__":
    main()
