"""The benchmarks' regression guard.

A benchmark pipes its output through this script: every line passes through unchanged, and
at the end each figure that has a committed value in docs/benchmarks.md (the ```guard block
of its "Regression guard" section) is judged against it:

    guard apply_to_running_p50_ms=151 (committed 143, lower is better, 30% allowed): ok
    guard agent_idle_rss_mib=52.0 (committed 41.0, lower is better, 10% allowed): regressed

Figures are read from lines of `key=value` words. A line that starts with a bare word (no
`=`) names the figures after it, up to the next bare word: `start_p50_ms kat=18.5
kat/crun=1.79` gives `start_p50_ms.kat` and `start_p50_ms.kat/crun`. The last value of a
figure counts.

The guard reports; it does not fail the benchmark (this 2-core machine is noisy, and a
benchmark's figures are not the test suite's pass/fail). `--check` parses the committed
block and tests the judgement itself (scripts/test.sh runs it).
"""
import os
import re
import sys

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks.md")


def figures(line):
    """The figures of one output line, by name."""
    label, found = None, {}
    for w in line.split():
        key, sep, value = w.partition("=")
        if not sep:
            # A bare word names the figures after it (a word of prose too, harmlessly).
            label = w
            continue
        if not key:
            continue
        m = re.match(r"^-?[0-9]+(\.[0-9]+)?", value)
        if not m:
            continue
        found[f"{label}.{key}" if label else key] = float(m.group(0))
    return found


def committed(text):
    """The guard block of docs/benchmarks.md: name -> (value, 'lower'|'higher', tolerance)."""
    block = re.search(r"^```guard\n(.*?)^```", text, re.S | re.M)
    if not block:
        raise ValueError(f"{DOCS}: no ```guard block")
    out = {}
    for n, line in enumerate(block.group(1).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 4 or parts[2] not in ("lower", "higher") or not parts[3].endswith("%"):
            raise ValueError(
                f"{DOCS}: guard line {n} {line!r}: expected NAME VALUE lower|higher TOLERANCE%")
        out[parts[0]] = (float(parts[1]), parts[2], float(parts[3][:-1]) / 100)
    return out


def judge(value, base, better, tolerance):
    """'ok' or 'regressed': worse than the committed value by more than the tolerance."""
    if better == "lower":
        worse = value > base * (1 + tolerance)
    else:
        worse = value < base * (1 - tolerance)
    return "regressed" if worse else "ok"


def check():
    base = committed(open(DOCS).read())
    assert base, "the guard block names no figure"
    assert figures("start_p50_ms kat=18.5 kat/crun=1.79 x") == {
        "start_p50_ms.kat": 18.5, "start_p50_ms.kat/crun": 1.79}
    assert figures("store_puts_per_s etcd=8241 watch_p50_us etcd=711") == {
        "store_puts_per_s.etcd": 8241.0, "watch_p50_us.etcd": 711.0}
    assert figures("apply_to_running_p50_ms=143 agent_idle_cpu_pct=0.6") == {
        "apply_to_running_p50_ms": 143.0, "agent_idle_cpu_pct": 0.6}
    assert judge(129, 100, "lower", 0.3) == "ok"
    assert judge(131, 100, "lower", 0.3) == "regressed"
    assert judge(0.8, 1.0, "higher", 0.25) == "ok"
    assert judge(0.7, 1.0, "higher", 0.25) == "regressed"
    print(f"guard: {len(base)} committed figures in {os.path.relpath(DOCS)}")


def main():
    if sys.argv[1:] == ["--check"]:
        check()
        return
    seen = {}
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        seen.update(figures(line))
    try:
        base = committed(open(DOCS).read())
    except (OSError, ValueError) as e:
        print(f"guard: {e}")
        return
    judged = 0
    for name, value in seen.items():
        if name not in base:
            continue
        b, better, tolerance = base[name]
        verdict = judge(value, b, better, tolerance)
        print(f"guard {name}={value:g} (committed {b:g}, {better} is better, "
              f"{tolerance * 100:g}% allowed): {verdict}")
        judged += 1
    if not judged:
        print("guard: none of this run's figures has a committed value")


if __name__ == "__main__":
    main()
