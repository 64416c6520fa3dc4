"""The second pass of scripts/link-order.sh (as root): the functions a node runs that the
instrumented build's counters do not name in the plain binary, added to the link order.

The counters miss three kinds of code: the standard library's (built without the
instrumentation), C and assembly (ring's and OpenSSL's ciphers, libgit2, zlib), and generic
instances the two builds placed differently. Each of them, running once, keeps 64 KiB of
code resident. So every function of the release binary that LIST does not name gets a uprobe
(tracefs), COMMAND runs the node, each probe is switched off at its first hit (a function
traps once however often it runs), and the functions that ran are appended to LIST in the
order they first ran. Names come from the very binary that ran.

The kernel is slow to remove many uprobes (about 20 minutes for 25,000 on 2 cores).

usage: link_order_uprobes.py BINARY LIST -- COMMAND...
"""
import os
import re
import subprocess
import sys
import time

from link_order import nm_functions  # this directory is on the path

GROUP = "kat_order"
EVENT = "katorder"  # uprobe_profile names an event without its group


def tracefs():
    for path in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.exists(f"{path}/uprobe_events"):
            return path
    path = "/tmp/kat-link-order-tracefs"
    os.makedirs(path, exist_ok=True)
    if not os.path.exists(f"{path}/uprobe_events"):
        subprocess.run(["mount", "-t", "tracefs", "none", path], check=True)
    return path


def functions(binary):
    """The binary's functions: (file offset, name), one per address."""
    load = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True,
                          check=True).stdout
    # The executable segment: file offset = address - (p_vaddr - p_offset).
    segment = next(parts for parts in (line.split() for line in load.splitlines())
                   if parts[:1] == ["LOAD"] and "E" in parts[6:-1])
    shift = int(segment[2], 16) - int(segment[1], 16)
    found, seen = [], set()
    for address, name in nm_functions(binary):
        if address not in seen:
            seen.add(address)
            found.append((address - shift, name))
    return found


def write(path, text):
    """Writes a tracefs file; False if the kernel refuses."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    binary, listing, command = sys.argv[1], sys.argv[2], sys.argv[4:]
    named = {line.strip() for line in open(listing) if not line.startswith("#")}
    funcs = [f for f in functions(binary) if f[1] not in named]
    trace = tracefs()
    write(f"{trace}/tracing_on", "0")
    # A full buffer drops new events rather than the first ones, which give the order.
    write(f"{trace}/options/overwrite", "0")
    write(f"{trace}/buffer_size_kb", "16384")
    with open(f"{trace}/trace", "w"):
        pass
    # One write per probe: the kernel refuses a probe it cannot place, and only that one.
    placed = sum(write(f"{trace}/uprobe_events", f"p:{GROUP}/{EVENT}{i} {binary}:{offset:#x}\n")
                 for i, (offset, _) in enumerate(funcs))
    write(f"{trace}/events/{GROUP}/enable", "1")
    write(f"{trace}/tracing_on", "1")
    print(f"{placed} of {len(funcs)} functions probed", flush=True)
    hit = set()
    profile = re.compile(rf"\s*\S+\s+{EVENT}(\d+)\s+(\d+)")

    def sweep():
        with open(f"{trace}/uprobe_profile") as f:
            for line in f:
                m = profile.match(line)
                if m and int(m.group(2)) > 0 and int(m.group(1)) not in hit:
                    hit.add(int(m.group(1)))
                    write(f"{trace}/events/{GROUP}/{EVENT}{m.group(1)}/enable", "0")

    try:
        run = subprocess.Popen(command)
        while run.poll() is None:
            sweep()
            time.sleep(0.2)
        time.sleep(3)  # the network holder stops once the node's directory is gone
        sweep()
    finally:
        write(f"{trace}/tracing_on", "0")
        first = {}
        event = re.compile(rf"\s(\d+\.\d+): {EVENT}(\d+):")
        with open(f"{trace}/trace") as f:
            for line in f:
                m = event.search(line)
                if m:
                    first.setdefault(int(m.group(2)), float(m.group(1)))
        print("removing the probes", flush=True)
        write(f"{trace}/events/{GROUP}/enable", "0")
        for i in range(len(funcs)):
            write(f"{trace}/uprobe_events", f"-:{GROUP}/{EVENT}{i}\n")
        write(f"{trace}/options/overwrite", "1")
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({run.returncode})")
    ran = sorted(hit, key=lambda i: first.get(i, float("inf")))
    with open(listing, "a") as f:
        f.write(f"# found by uprobes: {len(ran)} functions\n")
        f.write("".join(funcs[i][1] + "\n" for i in ran))
    print(f"{listing}: {len(ran)} functions added")


if __name__ == "__main__":
    main()
