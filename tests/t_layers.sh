#!/usr/bin/env bash
# The layers of libkhub (docs/architecture.md) hold: no source file
# includes, directly or through the headers it includes, a header of a
# layer it may not use. Internal headers are included by base name and
# found in any layer folder (the build puts them all on the path), so only
# this check keeps a lower layer from reaching up.
#
#   runtime/base      nothing above it
#   runtime/device    base, device, loader (the runtime core: the CUDA layer
#   runtime/loader      reports on the runtime object, the loader calls it)
#   runtime/executor  base, device, loader, executor: never the hub
#   hub               base, device (what the host's CPU and GPUs are), hub:
#                     never the loader or the executor (it never loads code)
#   runtime/kernels   everything below: a kernel as a unit (fetch and verify
#                     by the hub, load by the loader, bind at model load,
#                     check a kernel folder)
#   hub/author        libkhub_author (not libkhub): base, device, loader's ELF
#                     gate, hub, itself: build, templates, sign, publish
#   runtime/model_server  libkhub_model_server (not libkhub): base and itself;
#                     the model through libkhub's public API only
#   runtime/tune      libkhub_tune (not libkhub): itself, and of base only
#                     the header-only app_struct.h; the model through
#                     libkhub's public API
#   tools             public headers only (abi/), once issue 12 item 2 lands;
#                     until then not checked here
#
# Usage: t_layers.sh [SRC]   (SRC defaults to $KHUB_SRC)
set -euo pipefail
SRC=${1:-${KHUB_SRC:?set by ctest}}
command -v python3 > /dev/null || {
    echo "skip: python3 is not installed"
    exit 0
}

python3 - "$SRC" << 'EOF'
import os, re, sys

src = sys.argv[1]
# layer folder -> the layer folders its files may include from
allowed = {
    "runtime/base": {"runtime/base"},
    "runtime/device": {"runtime/base", "runtime/device", "runtime/loader"},
    "runtime/loader": {"runtime/base", "runtime/device", "runtime/loader"},
    "runtime/executor": {"runtime/base", "runtime/device", "runtime/loader", "runtime/executor"},
    "hub": {"runtime/base", "runtime/device", "hub"},
    "runtime/kernels": {"runtime/base", "runtime/device", "runtime/loader", "runtime/executor",
                        "hub", "runtime/kernels"},
    # libkhub_author, its own library above libkhub: `khub build` runs the
    # publish gate's ELF rules on what it built.
    "hub/author": {"runtime/base", "runtime/device", "runtime/loader", "hub", "hub/author"},
    # libkhub_model_server, above libkhub: the OpenAI server uses libkhub's
    # public API, and from the layers only base (errors, strict JSON).
    "runtime/model_server": {"runtime/base", "runtime/model_server"},
    # libkhub_tune, above libkhub: the advisor uses libkhub's public API only.
    "runtime/tune": {"runtime/tune"},
}
# Single headers a layer may include from a layer it may not otherwise use:
# header-only ones (static inline, nothing to link against libkhub's hidden
# symbols), each with its reason.
headers = {
    # how a caller's struct comes in (khub_tune_run's options), as in libkhub
    "runtime/tune": {"app_struct.h"},
}
# Known exceptions, each with its reason; an entry that is no longer needed
# fails the check too, so the list only shrinks.
exceptions = set()

home = {}  # header base name -> its layer folder
files = []
for layer in allowed:
    d = os.path.join(src, layer)
    if not os.path.isdir(d):
        continue
    for f in sorted(os.listdir(d)):
        if f.endswith((".c", ".h")):
            files.append((layer, f))
            if f.endswith(".h"):
                if f in home:
                    sys.exit("FAIL: header %s is in both %s and %s" % (f, home[f], layer))
                home[f] = layer

inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
direct = {}
for layer, f in files:
    with open(os.path.join(src, layer, f), encoding="utf-8", errors="replace") as fh:
        direct[(layer, f)] = [os.path.basename(i) for i in inc_re.findall(fh.read())
                              if not i.startswith(("khub/", "../"))]

def closure(key):
    seen, todo = {}, [(key, None)]
    while todo:
        (layer, f), via = todo.pop()
        for h in direct.get((layer, f), []):
            if h in seen or h not in home:
                continue
            seen[h] = via or h
            todo.append(((home[h], h), seen[h]))
    return seen  # header -> the header of key's own includes that brings it

bad, used = [], set()
for layer, f in files:
    for h, via in sorted(closure((layer, f)).items()):
        if home[h] in allowed[layer] or h in headers.get(layer, ()):
            continue
        if ("%s/%s" % (layer, f), via) in exceptions:
            used.add(("%s/%s" % (layer, f), via))
            continue
        how = "" if via == h else " (through %s)" % via
        bad.append("%s/%s includes %s/%s%s: %s may use only %s" %
                   (layer, f, home[h], h, how, layer, ", ".join(sorted(allowed[layer]))))
for e in sorted(exceptions - used):
    bad.append("exception %s -> %s is no longer needed: remove it from t_layers.sh" % e)
for b in bad:
    print("FAIL:", b)
if bad:
    sys.exit(1)
print("ok   %d files in %d layers include only what their layer may use" %
      (len(files), len(allowed)))
EOF
