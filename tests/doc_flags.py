#!/usr/bin/env python3
"""doc_flags.py KHUB FILE.md...: the docs and `khub --help` agree on flags.

1. Every `khub COMMAND ... --flag` the pages show (fenced code blocks, with
   their continuation lines joined; 4-space indented code; inline code
   spans) names a command that `khub --help` lists and a flag that
   `khub COMMAND --help` prints.
2. Every flag `khub COMMAND --help` prints is described there: it appears
   outside the usage lines too (an option line or the text), not only in
   `usage: ...`.

Prints one line per finding and exits 1 when there is any (tests/t_doc_flags.sh).
"""
import re
import subprocess
import sys

HIDDEN = {"tune-rank"}  # a hidden command (khub --help leaves it out on purpose)


def run_help(khub, *args):
    r = subprocess.run([khub, *args, "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{khub} {' '.join(args)} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def commands(text):
    """Every piece of a page a user would type: code lines and code spans."""
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        yield from block.replace("\\\n", " ").splitlines()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"(?m)^    (\S.*(?:\\\n    .*)*)", text):
        yield m.group(1).replace("\\\n", " ")
    for span in re.findall(r"`([^`]+)`", text.replace("\n", " ")):
        yield span


def flags(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def main():
    khub, pages = sys.argv[1], sys.argv[2:]
    top = run_help(khub)
    listed = top.split("Commands:", 1)[1].split("Options:", 1)[0]
    subs = set(re.findall(r"^  ([a-z][a-z-]*) ", listed, re.M))
    helps = {}
    findings = []
    for sub in sorted(subs):
        helps[sub] = run_help(khub, sub)
        body = re.sub(r"(?ms)^usage:.*?^$", "", helps[sub], count=1)
        for f in sorted(flags(helps[sub]) - flags(body)):
            findings.append(f"khub {sub} --help: {f} is in the usage line only, never described")
    seen = set()
    for page in pages:
        for line in commands(open(page, encoding="utf-8").read()):
            for m in re.finditer(r"(?:^|[\s(;&$])khub ([a-z][a-z-]*)([^|;&#`]*)", line):
                sub, rest = m.group(1), m.group(2)
                rest = re.split(r"\bkhub [a-z]", rest)[0]
                if sub not in subs:
                    if sub not in HIDDEN and flags(rest):
                        key = (page, sub, "")
                        if key not in seen:
                            seen.add(key)
                            findings.append(f"{page}: khub {sub}: no such command in khub --help")
                    continue
                for f in sorted(flags(rest) - flags(helps[sub])):
                    key = (page, sub, f)
                    if key not in seen:
                        seen.add(key)
                        findings.append(f"{page}: khub {sub} {f}: not in khub {sub} --help "
                                        f"(in: {line.strip()[:120]})")
    for f in findings:
        print(f)
    sys.exit(1 if findings else 0)


main()
