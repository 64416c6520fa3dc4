"""A workload's instances as the API reports them, over one kept-alive HTTPS connection: what
the benchmarks poll (bench/apply_to_running.py, bench/poll_running.py)."""
import http.client, json, ssl


class WorkloadApi:
    def __init__(self, host, port, ca_file, token):
        self.conn = http.client.HTTPSConnection(host, port, context=ssl.create_default_context(cafile=ca_file))
        self.token = token

    def instances(self, name, namespace="default"):
        """The instances of workload `name` (empty while it does not exist)."""
        self.conn.request("GET", f"/v1alpha1/n/{namespace}/workloads/{name}",
                          headers={"Authorization": f"Bearer {self.token}"})
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            return []
        return json.loads(body)["status"].get("instances", [])

    def close(self):
        self.conn.close()
