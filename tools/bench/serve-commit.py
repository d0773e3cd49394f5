#!/usr/bin/env python3
"""serve-commit.py: the server CPU time of two large commits to `khub serve`
(session 19, the commit's LFS marks). Commit 1 stores N paths through LFS
(lfsFile), commit 2 writes N plain files on top (each a lookup among the N
marks it inherits), then one paths-info request (no token needed) names
10,000 paths of commit 2 (each asks whether it is an LFS file by its mark). CPU is the server process's user and system time
(/proc/PID/stat) across each request, so a loaded machine changes it little;
the system time is ext4 creating, syncing and renaming the files.

  tools/bench/serve-commit.py [--khub build/bin/khub] [--n 50000] [--rounds 3]

Prints one line per round: seconds of server CPU (user, system) for each commit.
"""
import argparse, json, os, shutil, subprocess, tempfile, time, urllib.request

C1 = "1" * 40
OID = "0123456789abcdef" * 4
TOKEN = "bench-token"


def cpu_s(pid):
    """(user, system) seconds of CPU the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def commit(port, lines):
    body = "\n".join(json.dumps(l) for l in lines).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/kernels/org/demo/commit/main", data=body, method="POST",
        headers={"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=600) as r:
        assert r.status == 200, r.status


def one_round(khub, n):
    root = tempfile.mkdtemp(prefix="khub-serve-commit-")
    try:
        os.makedirs(f"{root}/org/demo/commits/{C1}")
        os.makedirs(f"{root}/org/demo/lfs")
        with open(f"{root}/org/demo/refs.json", "w") as f:
            json.dump({"branches": {"main": C1}}, f)
        with open(f"{root}/org/demo/commits/{C1}/README.md", "w") as f:
            f.write("# demo\n")
        with open(f"{root}/org/demo/lfs/{OID}", "w") as f:
            f.write("lfs object bytes")
        p = subprocess.Popen([khub, "serve", root, "--token", TOKEN, "--max-body", "256"],
                             stdout=subprocess.PIPE, text=True)
        try:
            port = int(p.stdout.readline().split()[-1].rsplit(":", 1)[-1].strip("/"))
            hdr = {"key": "header", "value": {"summary": "bench"}}
            ops1 = [hdr] + [{"key": "lfsFile", "value": {"path": f"d{i % 100}/f{i}.bin", "oid": OID}}
                            for i in range(n)]
            ops2 = [hdr] + [{"key": "file", "value": {"path": f"p{i % 100}/t{i}.txt", "content": "x"}}
                            for i in range(n)]
            out = []
            for ops in (ops1, ops2):
                u0, s0 = cpu_s(p.pid)
                commit(port, ops)
                u1, s1 = cpu_s(p.pid)
                out.append((u1 - u0, s1 - s0))
            paths = "&".join(f"paths=p{i % 100}/t{i}.txt" for i in range(10000)).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/kernels/org/demo/paths-info/main", data=paths,
                method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"})
            u0, s0 = cpu_s(p.pid)
            with urllib.request.urlopen(req, timeout=600) as r:
                assert len(json.load(r)) == min(n, 10000)
            u1, s1 = cpu_s(p.pid)
            out.append((u1 - u0, s1 - s0))
            return out
        finally:
            p.terminate()
            p.wait()
    finally:
        shutil.rmtree(root)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--khub", default="build/bin/khub")
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for _ in range(a.rounds):
        c1, c2, pi = one_round(a.khub, a.n)
        print(f"{a.khub} n={a.n}: commit 1 (lfsFile) user {c1[0]:.2f} sys {c1[1]:.2f} s, "
              f"commit 2 (file) user {c2[0]:.2f} sys {c2[1]:.2f} s, "
              f"paths-info user {pi[0]:.2f} sys {pi[1]:.2f} s", flush=True)


if __name__ == "__main__":
    main()
