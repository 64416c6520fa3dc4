"""Writes the link order of the agent's binary from the counters of an instrumented run
(scripts/link-order.sh): every function that ran, the network holder's first, then the
agent's, then the helpers', each group in the order of the plain release binary.

usage: link_order.py LLVM_PROFDATA RAW_DIR RELEASE_BINARY OUTPUT
"""
import os
import re
import subprocess
import sys

HOLDER_MARK = "9kat_netns6holder3run"  # kat_netns::holder::run, mangled
KATCALL_MARK = "_ZN7katcall"

# A Rust symbol ends in a hash of its crate and instance. A function the instrumented build
# names with a hash the plain build lacks (a generic instance the two builds placed in
# different crates, or an older build's) is matched without it: every instance of that
# generic function is placed, some that did not run with those that did.
HASH = re.compile(r"17h[0-9a-f]{16}E$")


def unhashed(name):
    return HASH.sub("E", name)


def covered(profdata, raw):
    """The functions a process's counters say ran. Local functions are named `file;name`."""
    out = subprocess.run([profdata, "show", "--covered", raw],
                         capture_output=True, text=True, check=True).stdout
    return {line.strip().rsplit(";", 1)[-1] for line in out.splitlines() if line.strip()}


def nm_functions(binary):
    """The binary's functions in address order: (address, name), every name of each."""
    out = subprocess.run(["nm", "-n", "--defined-only", binary], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTW":
            yield int(parts[0], 16), parts[2]


def text_symbols(binary):
    """The release binary's functions: address by name, and names by name without the hash."""
    exact, loose = {}, {}
    for address, name in nm_functions(binary):
        exact.setdefault(name, address)
        loose.setdefault(unhashed(name), []).append(name)
    return exact, loose


def placed(names, symbols):
    """The release binary's functions for these names, in the binary's order."""
    exact, loose = symbols
    found = set()
    for name in names:
        if name in exact:
            found.add(name)
        else:
            found.update(loose.get(unhashed(name), ()))
    return sorted(found, key=exact.get)


def main():
    profdata, raw_dir, binary, output = sys.argv[1:5]
    runs = [covered(profdata, os.path.join(raw_dir, f))
            for f in sorted(os.listdir(raw_dir)) if f.endswith(".profraw")]
    # katcall's runs (the benchmark drives the node with it) are another binary's.
    runs = [r for r in runs if not any(n.startswith(KATCALL_MARK) for n in r)]
    if not runs:
        sys.exit(f"no counters under {raw_dir}: did the instrumented node run?")
    holder = set().union(*(r for r in runs if any(HOLDER_MARK in n for n in r)))
    if not holder:
        sys.exit("no network holder's counters: it writes them when it exits")
    others = [r for r in runs if not any(HOLDER_MARK in n for n in r)]
    agent = max(others, key=len, default=set())
    helpers = set().union(*others) if others else set()
    symbols = text_symbols(binary)
    groups = [("the network holder", holder),
              ("the agent", agent - holder),
              ("the helpers", helpers - holder - agent)]
    lines = ["# The link order of kat-agent's functions: written by scripts/link-order.sh from",
             "# an instrumented run of a node; read by agent/build.rs. Generated: do not edit."]
    counts, seen = [], set()
    for what, names in groups:
        mine = [name for name in placed(names, symbols) if name not in seen]
        seen.update(mine)
        counts.append(f"{what} {len(mine)}")
        lines.append(f"# {what}: {len(mine)} functions")
        lines.extend(mine)
    with open(output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{output}: " + ", ".join(counts) + f" of {len(symbols[0])} functions in {binary}")


if __name__ == "__main__":
    main()
