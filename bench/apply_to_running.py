"""The measuring half of bench/apply-to-running.sh (see there)."""
import bisect, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

from workload_api import WorkloadApi

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from link_order import nm_functions  # noqa: E402

BIN = os.path.abspath(os.environ.get("KAT_BENCH_BIN", "target/release"))
REGISTRY = os.environ["KAT_TEST_REGISTRY"]
RUNS = int(os.environ.get("RUNS", "20"))


def code_residency(pid, binary, listing="agent/link-order.txt"):
    """Where the agent's resident code is, against the link order (agent/build.rs):
    (listed functions this binary defines, listed functions, resident MiB of code on the
    pages the listed functions occupy, resident MiB elsewhere). The list names functions
    exactly, so a change to code a node runs drops names from it and adds functions it never
    named; each such function that runs keeps up to 64 KiB around it resident (fault-around),
    and the second figure grows. None where something cannot be read."""
    try:
        listed = [l for l in open(listing).read().splitlines() if l and not l.startswith("#")]
        where, starts = {}, set()
        for address, name in nm_functions(binary):
            where.setdefault(name, address)
            starts.add(address)
        starts = sorted(starts)
        page = os.sysconf("SC_PAGE_SIZE")
        # A listed function runs to the next function's start.
        listed_pages, found = set(), 0
        for name in listed:
            if name not in where:
                continue
            found += 1
            start = where[name]
            end = starts[bisect.bisect_right(starts, start)] if start < starts[-1] else start + 1
            listed_pages.update(range(start // page, (end - 1) // page + 1))
        # A position-independent binary: its addresses are offsets from where it is loaded,
        # the start of its mapping at file offset 0.
        base, text = None, []
        real = os.path.realpath(binary)
        for line in open(f"/proc/{pid}/maps"):
            parts = line.split()
            if len(parts) < 6 or os.path.realpath(parts[5]) != real:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if int(parts[2], 16) == 0 and base is None:
                base = start
            if "x" in parts[1]:
                text.append((start, end))
        if base is None or not text or not found:
            return None
        inside = outside = 0
        # /proc/PID/pagemap: 8 bytes per virtual page, bit 63 set where the page is present.
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for start, end in text:
                pagemap.seek(start // page * 8)
                entries = pagemap.read((end - start) // page * 8)
                for i in range(0, len(entries), 8):
                    if entries[i + 7] & 0x80:
                        if (start - base) // page + i // 8 in listed_pages:
                            inside += 1
                        else:
                            outside += 1
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None
    mib = page / 2**20
    return found, len(listed), inside * mib, outside * mib


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


work = tempfile.mkdtemp(prefix="kat-bench-apply-")
os.chmod(work, 0o711)
api_port = free_port()
with open(f"{work}/cluster.kat", "w") as f:
    f.write(f"""apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: bench
spec:
  clusterCIDR: 10.100.0.0/16
  serviceCIDR: 10.200.0.0/16
  apiPort: {api_port}
  etcdClientPort: {free_port()}
  etcdPeerPort: {free_port()}
  agentTickSeconds: 5
  volumeBasePath: {work}/volumes
""")
env = dict(os.environ, KAT_CONFIG=f"{work}/katcall.yaml", KAT_INIT=os.environ["KAT_INIT"])
agent = subprocess.Popen(
    [f"{BIN}/kat-agent", "init", "--config", f"{work}/cluster.kat", "--data-dir", f"{work}/data",
     "--node-name", "bench", "--client-config", f"{work}/katcall.yaml", "--api-bind", "127.0.0.1",
     "--insecure-registry", REGISTRY, "--stop-grace-seconds", "1"],
    stdout=open(f"{work}/agent.log", "w"), stderr=subprocess.STDOUT, env=env)


def katcall(*args):
    return subprocess.run([f"{BIN}/katcall", *args], env=env, capture_output=True, text=True)


def cleanup():
    for name in names:
        katcall("delete", "workload", name)
    # Containers outlive their agent: wait until the node has stopped them (each drains for
    # its grace period first), or they keep running after the benchmark.
    containers = f"{work}/data/runtime/containers"
    deadline = time.time() + 30
    while time.time() < deadline and agent.poll() is None:
        if not os.path.isdir(containers) or not os.listdir(containers):
            break
        time.sleep(0.5)
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=30)
    if os.environ.get("KAT_BENCH_KEEP") == "1":
        print(f"kept {work} (agent.log)")
    else:
        shutil.rmtree(work, ignore_errors=True)


names = []
try:
    deadline = time.time() + 60
    while "Ready" not in katcall("get", "nodes").stdout:
        if time.time() > deadline or agent.poll() is not None:
            sys.exit("the node did not come up; see " + f"{work}/agent.log")
        time.sleep(0.2)
    token = open(f"{work}/data/pki/admin.token").read().strip()
    api = WorkloadApi("127.0.0.1", api_port, f"{work}/data/pki/ca.crt", token)
    instances = api.instances

    def workload(name, replicas, script):
        d = f"{work}/{name}"
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/workload.kat", "w") as f:
            f.write(f"""apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: {name}
  namespace: default
spec:
  type: Service
  source:
    image: {REGISTRY}/kat/busybox:latest
  replicas: {replicas}
  restartPolicy:
    condition: Always
  container:
    command: ["/bin/sh", "-c", "{script}"]
    resources:
      limits:
        cpu: 100m
        memory: 32Mi
""")
        return d

    # Pull the image once, outside the measurement.
    warm = workload("warm", 1, "sleep 3600")
    names.append("warm")
    katcall("apply", "-f", warm)
    while not any(i["state"] == "Running" for i in instances("warm")):
        time.sleep(0.05)
    katcall("delete", "workload", "warm")
    names.remove("warm")

    samples = []
    for run in range(RUNS):
        name = f"app{run}"
        d = workload(name, 3, "sleep 3600")
        names.append(name)
        start = time.perf_counter()
        out = katcall("apply", "-f", d)
        if out.returncode != 0:
            sys.exit(out.stderr)
        while True:
            inst = instances(name)
            if len(inst) == 3 and all(i["state"] == "Running" for i in inst):
                break
            if time.perf_counter() - start > 30:
                sys.exit(f"{name} did not reach 3 running instances: {inst}")
            # Every 10 ms: the API allows a client 100 requests a second after a burst of
            # 200, so a faster poll is refused (429) a few runs in.
            time.sleep(0.01)
        samples.append((time.perf_counter() - start) * 1000)
        katcall("delete", "workload", name)
        names.remove(name)
    time.sleep(3)

    # Idle with 10 running containers.
    d = workload("idle", 10, "sleep 3600")
    names.append("idle")
    katcall("apply", "-f", d)
    while sum(i["state"] == "Running" for i in instances("idle")) < 10:
        time.sleep(0.1)
    api.close()
    time.sleep(10)

    def proc_cpu(pid):
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wakeups_by_thread(pid):
        """Each thread of `pid`'s voluntary context switches: the times it slept and was woken,
        which a poll on a clock adds to whatever the machine's speed."""
        counts = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                for line in open(f"/proc/{pid}/task/{tid}/status"):
                    if line.startswith("voluntary_ctxt_switches:"):
                        counts[tid] = int(line.split()[1])
            except OSError:
                pass  # gone since the listing
        if not counts:
            raise RuntimeError(f"no thread of {pid} has a voluntary_ctxt_switches count")
        return counts

    def status_mib(pid, field):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    def rss_mib(pid):
        return status_mib(pid, "VmRSS")

    def referenced_mib(pid):
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Referenced:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def holder_pids():
        """This run's network holder and its namespace keeper: processes of the agent's
        binary started with `__kat-netns-holder` for a directory under `work`."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                # This run's: its request names the run's data directory.
                if b"__kat-netns-holder" in argv and any(work.encode() in a for a in argv):
                    found.append(int(entry))
        return sorted(found)

    etcd_pid = int(subprocess.run(["pgrep", "-P", str(agent.pid), "etcd"], capture_output=True, text=True).stdout.split()[0])
    window = 30
    # The idle working set: clear the accessed bits of every page the agent maps, and count
    # at the end of the window the pages it touched again. RSS also holds code that ran once
    # (start-up, the applies above) and stays mapped until the kernel needs the memory.
    with open(f"/proc/{agent.pid}/clear_refs", "w") as f:
        f.write("1")
    c0, e0, r0, t0 = proc_cpu(agent.pid), proc_cpu(etcd_pid), wakeups_by_thread(agent.pid), time.time()
    time.sleep(window)
    wss = referenced_mib(agent.pid)
    c1, e1, r1, t1 = proc_cpu(agent.pid), proc_cpu(etcd_pid), wakeups_by_thread(agent.pid), time.time()
    cpu_pct = (c1 - c0) / (t1 - t0) * 100
    etcd_pct = (e1 - e0) / (t1 - t0) * 100
    # A thread that ended in the window loses its count; one that started counts from 0.
    wakeups = sum(n - r0.get(tid, 0) for tid, n in r1.items()) / (t1 - t0)
    # This machine moves idle CPU by 3x between runs (docs/benchmarks.md, "Idle CPU"); etcd,
    # idle beside the agent in the same window, moves with it: the ratio is the steadier
    # figure. Not an independent one: part of etcd's idle CPU answers the agent's requests.
    cpu_per_etcd = cpu_pct / etcd_pct if etcd_pct > 0 else float("nan")
    rss = rss_mib(agent.pid)
    rss_anon, rss_file = status_mib(agent.pid, "RssAnon"), status_mib(agent.pid, "RssFile")
    threads = len(os.listdir(f"/proc/{agent.pid}/task"))
    if os.environ.get("KAT_BENCH_SMAPS") == "1":
        # Where the resident memory is: the largest mappings by Rss (and how much of each
        # is anonymous: heap, stacks, pages the loader's relocations copied).
        maps, current = [], None
        for line in open(f"/proc/{agent.pid}/smaps"):
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                current = [0, 0, parts[0], parts[1], parts[5] if len(parts) > 5 else "[anon]"]
                maps.append(current)
            elif parts[0] == "Rss:":
                current[0] = int(parts[1])
            elif parts[0] == "Anonymous:":
                current[1] = int(parts[1])
        for rss_kib, anon_kib, addr, perms, name in sorted(maps, reverse=True)[:20]:
            print(f"  {rss_kib:>7} KiB (anon {anon_kib:>6})  {perms}  {addr}  {name}")
        # Not `names`: that is the list of workloads cleanup() deletes (reusing it left the
        # idle workload's 10 containers running after each run with KAT_BENCH_SMAPS=1).
        by_name = {}
        for task in os.listdir(f"/proc/{agent.pid}/task"):
            try:
                comm = open(f"/proc/{agent.pid}/task/{task}/comm").read().strip()
            except OSError:
                continue
            key = comm.rstrip("0123456789")
            by_name[key] = by_name.get(key, 0) + 1
        print("  threads: " + ", ".join(f"{k}x{v}" for k, v in sorted(by_name.items())))
    samples.sort()
    p50 = statistics.median(samples)
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    print("apply -> 3 running, each run (ms, sorted):", " ".join(f"{x:.0f}" for x in samples))
    print(f"apply -> 3 running, {RUNS} runs: p50 {p50:.0f} ms, p95 {p95:.0f} ms, min {samples[0]:.0f} ms, max {samples[-1]:.0f} ms")
    print(f"idle with 10 containers over {window}s: kat-agent RSS {rss:.1f} MiB, CPU {cpu_pct:.2f}% of a core; "
          f"etcd (separate) RSS {rss_mib(etcd_pid):.1f} MiB, CPU {etcd_pct:.2f}%")
    print(f"kat-agent RSS split: heap and stacks (RssAnon) {rss_anon:.1f} MiB, "
          f"mapped code and files (RssFile) {rss_file:.1f} MiB, {threads} threads")
    print(f"kat-agent idle working set (pages touched in the {window}s window): {wss:.1f} MiB")
    print(f"kat-agent idle: {wakeups:.1f} thread wake-ups per second; CPU {cpu_per_etcd:.2f}x etcd's")
    holders = []
    for pid in holder_pids():
        try:
            holders.append((rss_mib(pid), status_mib(pid, "RssAnon")))
        except OSError:
            pass  # gone since the listing
    print("network holder and namespace keeper RSS: "
          + ", ".join(f"{rss:.1f} MiB (anon {anon:.1f})" for rss, anon in holders))
    print("for comparison, k3s documents 275 MB for an agent")
    holder_rss = max((rss for rss, _ in holders), default=0.0)
    residency = code_residency(agent.pid, f"{BIN}/kat-agent")
    outside = float("nan")
    if residency:
        found, listed, inside, outside = residency
        print(f"kat-agent resident code: {inside:.1f} MiB on the listed functions' pages, {outside:.1f} MiB "
              f"elsewhere; {found} of the {listed} functions agent/link-order.txt lists are in "
              "this binary (when the code outside grows, regenerate it: sudo scripts/link-order.sh)")
    print(f"apply_to_running_p50_ms={p50:.0f} agent_idle_rss_mib={rss:.1f} agent_idle_cpu_pct={cpu_pct:.2f} "
          f"agent_idle_wss_mib={wss:.1f} holder_rss_mib={holder_rss:.1f} "
          f"agent_idle_cpu/etcd={cpu_per_etcd:.2f} agent_idle_wakeups_per_s={wakeups:.1f} "
          f"agent_code_outside_order_mib={outside:.1f}")
finally:
    cleanup()
