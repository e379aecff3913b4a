#!/usr/bin/env python3
"""How many translation units include a header, directly or through other headers: the rebuild cost of touching it
(docs/BENCHMARKS.md "Build and test time").

Resolves every #include "..." of the tree's tracked C++ files through the include folders (mc/<lib>/x.hpp), the
including file's own folder and a source folder's internal headers ("tcp/net.hpp"), and prints, for each HEADER,
how many .cpp files have it in their include closure.

Usage: tools/include-fanout.py REPO HEADER...   (HEADER paths relative to REPO)
"""
import os
import re
import subprocess
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root, headers = argv[1], argv[2:]
    os.chdir(root)
    files = subprocess.check_output(["git", "ls-files", "*.cpp", "*.hpp", "*.h"], text=True).split()
    by_include_path = {}
    for f in files:
        m = re.search(r"include/(mc/.*)$", f)
        if m:
            by_include_path[m.group(1)] = f
    include_re = re.compile(r'#include "([^"]+)"')
    deps = {}
    for f in files:
        out = []
        with open(f, errors="ignore") as src:
            text = src.read()
        for m in include_re.finditer(text):
            name = m.group(1)
            target = by_include_path.get(name)
            if target is None:
                local = os.path.normpath(os.path.join(os.path.dirname(f), name))
                if os.path.exists(local):
                    target = local
                else:
                    target = next((g for g in files if g.endswith("/" + name)), None)
            if target:
                out.append(target)
        deps[f] = out
    closure_of = {}

    def closure(f):
        if f in closure_of:
            return closure_of[f]
        closure_of[f] = set()  # cycles end here
        seen = set()
        for d in deps.get(f, []):
            seen.add(d)
            seen |= closure(d)
        closure_of[f] = seen
        return seen

    units = [f for f in files if f.endswith(".cpp")]
    print(f"{root}: {len(units)} .cpp files")
    for h in headers:
        n = sum(1 for u in units if h in closure(u))
        print(f"  {h}: in the include closure of {n} ({100 * n / len(units):.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
