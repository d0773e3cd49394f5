#!/usr/bin/env bash
# abi/layout.c is complete: every struct the plugin ABI headers define has
# its sizeof pinned there, and every field its offsetof (or, for the
# KHUB_STRUCT_HEADER fields, a KHUB_LAYOUT_HEADER line), so a field appended
# without being frozen fails the suite. The values themselves are checked
# at compile time by test_abi_layout.
set -euo pipefail
SRC=${KHUB_SRC:?}
python3 - "$SRC/abi/khub/khub_plugin.h" "$SRC/abi/khub/khub_tensor.h" "$SRC/abi/layout.c" <<'PY'
import re, sys
*headers, layout = sys.argv[1:]
lay = open(layout).read()
problems, n_structs, n_fields = [], 0, 0
for h in headers:
    text = re.sub(r"/\*.*?\*/", "", open(h).read(), flags=re.S)
    # Target-minor gates (#if KHUB_PLUGIN_TARGET_MINOR >= x) are not fields.
    text = re.sub(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b.*$", "", text, flags=re.M)
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\n\} (\w+);", text, re.S):
        name, body = m.group(3), m.group(2)
        n_structs += 1
        if f"sizeof({name})" not in lay:
            problems.append(f"{name}: no sizeof")
        fields = []
        for stmt in body.split(";"):
            stmt = " ".join(stmt.split())
            if not stmt:
                continue
            if stmt == "KHUB_STRUCT_HEADER":
                if f"KHUB_LAYOUT_HEADER({name})" not in lay:
                    problems.append(f"{name}: no KHUB_LAYOUT_HEADER")
                continue
            fp = re.search(r"\(\*(\w+)\)", stmt)
            if fp:
                fields.append(fp.group(1))
                continue
            decl = re.sub(r"__attribute__\(\(.*\)\)", "", stmt)
            for part in decl.split(","):
                f = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", part.strip())
                if not f:
                    problems.append(f"{name}: cannot parse '{stmt}'")
                else:
                    fields.append(f.group(1))
        for f in fields:
            n_fields += 1
            if not re.search(rf"offsetof\({name}, {f}\)", lay):
                problems.append(f"{name}.{f}: no offsetof")
if n_structs < 15:
    problems.append(f"only {n_structs} structs found: the parser is broken")
for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print(f"ok   {n_structs} structs, {n_fields} fields and every header pinned in abi/layout.c")
PY
echo "1 passed, 0 failed"
