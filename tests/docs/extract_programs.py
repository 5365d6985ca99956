#!/usr/bin/env python3
"""Extracts every ```cpp block of the README and the guides into a program of its own, so that
`make test` compiles and runs the documentation and a stale example breaks the build.

A block with a main() is written as it is; any other block is a fragment and is written inside
`run(argc, argv, [] { ... })` with `using namespace tessera;` (the ranks a fragment like the
README's gradient example runs on). Writes <out>/<doc>_<n>.cpp and <out>/programs.txt, one
program name per line; a file is rewritten only when its text changes, so an unchanged program
is not rebuilt.
"""
import pathlib
import re
import sys

FRAGMENT = """// Extracted from {doc} (block {n}) by tests/docs/extract_programs.py: a fragment, run on the ranks.
#include <tessera/tessera.hpp>

int main(int argc, char** argv) {{
  using namespace tessera;
  return run(argc, argv, [] {{
{body}
  }});
}}
"""
WHOLE = "// Extracted from {doc} (block {n}) by tests/docs/extract_programs.py.\n{body}"


def blocks(text):
    return re.findall(r"^```cpp\n(.*?)^```", text, flags=re.S | re.M)


def write_if_changed(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for doc in map(pathlib.Path, sys.argv[2:]):
        stem = re.sub(r"[^A-Za-z0-9]+", "_", doc.stem.lower()).strip("_")
        for n, body in enumerate(blocks(doc.read_text()), start=1):
            name = f"{stem}_{n}"
            if re.search(r"\bint main\s*\(", body):
                text = WHOLE.format(doc=doc.name, n=n, body=body)
            else:
                indented = "\n".join(("    " + line) if line else "" for line in body.rstrip("\n").split("\n"))
                text = FRAGMENT.format(doc=doc.name, n=n, body=indented)
            write_if_changed(out / f"{name}.cpp", text)
            names.append(name)
    write_if_changed(out / "programs.txt", "\n".join(names) + "\n")


if __name__ == "__main__":
    main()
