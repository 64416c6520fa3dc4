"""Polls the API for a workload until its instances run as wanted, the way
bench/apply_to_running.py does: one kept-alive HTTPS connection, a look every 10 ms (within the
API's rate limit). Used by the three-node benchmark (agent/tests/cluster/benchmark.rs), run in
a node's network namespace so that no process start or TLS handshake is in the measurement.

  python3 poll_running.py ENDPOINT CA_FILE TOKEN_FILE WORKLOAD REPLICAS PER_NODE

Prints `ready` once connected, waits for a line on stdin (the apply has begun), then prints
`running` when REPLICAS instances run, PER_NODE on each node. Exits 1 after 60 s."""
import sys, time, urllib.parse

from workload_api import WorkloadApi

endpoint, ca, token_file, name, replicas, per_node = sys.argv[1:7]
replicas, per_node = int(replicas), int(per_node)
url = urllib.parse.urlparse(endpoint)
api = WorkloadApi(url.hostname, url.port, ca, open(token_file).read().strip())
instances = lambda: api.instances(name)

instances()  # connected, handshake done
print("ready", flush=True)
sys.stdin.readline()
deadline = time.time() + 60
while time.time() < deadline:
    by_node = {}
    for i in instances():
        if i.get("state") == "Running":
            by_node[i.get("node")] = by_node.get(i.get("node"), 0) + 1
    if sum(by_node.values()) == replicas and all(n == per_node for n in by_node.values()):
        print("running", flush=True)
        sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
