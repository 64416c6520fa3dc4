//! The workload bundles the steps apply.

pub(crate) fn web(image: &str, greeting: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: web
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 2
  updateStrategy:
    type: Rolling
    rolling:
      maxSurge: 1
  restartPolicy:
    condition: Always
  container:
    command: [\"/bin/sh\", \"-c\"]
    args: [\"echo $GREETING from $HOSTNAME; mkdir -p /data/www; echo hi > /data/www/index.html; exec httpd -f -p 8080 -h /data/www\"]
    env:
      - name: GREETING
        value: {greeting}
      - name: KAT_E2E
        value: \"1\"
    volumeMounts:
      - name: data
        mountPath: /data
    resources:
      limits:
        cpu: 200m
        memory: 64Mi
  volumes:
    - name: data
      simpleClusterStorage: {{}}
"
            ),
        ),
        (
            "VirtualLoadBalancer.kat",
            "apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8080
  healthCheck:
    exec:
      command: [\"/bin/sh\", \"-c\", \"test -f /data/www/index.html\"]
    initialDelaySeconds: 0
    periodSeconds: 1
"
            .to_string(),
        ),
    ]
}

pub(crate) fn simple(
    name: &str,
    image: &str,
    policy: &str,
    script: &str,
) -> Vec<(&'static str, String)> {
    vec![(
        "workload.kat",
        format!(
            "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: {name}
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 1
  restartPolicy:
{policy}
  container:
    command: [\"/bin/sh\", \"-c\", {script:?}]
    env:
      - name: KAT_E2E
        value: \"1\"
"
        ),
    )]
}

pub(crate) fn git_workload(
    name: &str,
    repo: &str,
    source: &str,
    policy: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source:\n    git: {{repository: \"{repo}\", {source}}}\n  replicas: 1\n  restartPolicy: {{condition: {policy}}}\n  container:\n    command: [/bin/sh, -c, 'cat /greeting /commit.txt; exec sleep 3600']\n"
            ),
        ),
        (
            "build.kat",
            "apiVersion: kat.dws.rip/v1alpha1\nkind: BuildDefinition\nspec:\n  buildContext: app\n  dockerfilePath: Dockerfile\n  targetStage: final\n  buildArgs: {GREETING: hello-from-build-args}\n".to_string(),
        ),
    ]
}

/// A Job whose first attempt fails and second succeeds (a marker on its volume), under
/// `restartPolicy: MaxCount` with `backoffLimit: 0`.
pub(crate) fn retrying_job(image: &str) -> Vec<(&'static str, String)> {
    job(
        "retry",
        image,
        "    condition: MaxCount\n    maxRestarts: 1",
        "if [ -e /data/tried ]; then echo second; exit 0; fi; touch /data/tried; exit 3",
        0,
    )
}

/// A Job whose every attempt fails (exit 4), under `restartPolicy: Never` with
/// `backoffLimit: 1`: two instances, then the run fails.
pub(crate) fn doomed_job(image: &str) -> Vec<(&'static str, String)> {
    job("doomed", image, "    condition: Never", "exit 4", 1)
}

/// A Job `name` running `script` under `policy` (the lines of `restartPolicy`), with a
/// volume at /data and one completion allowed `backoff_limit` failures.
fn job(
    name: &str,
    image: &str,
    policy: &str,
    script: &str,
    backoff_limit: u32,
) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: {name}
  namespace: default
spec:
  type: Job
  source:
    image: {image}
  restartPolicy:
{policy}
  container:
    command: [\"/bin/sh\", \"-c\", \"{script}\"]
    volumeMounts:
      - name: data
        mountPath: /data
  volumes:
    - name: data
      simpleClusterStorage: {{}}
"
            ),
        ),
        (
            "job.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: JobDefinition
spec:
  completions: 1
  backoffLimit: {backoff_limit}
"
            ),
        ),
    ]
}

/// A Service whose first run never passes its health check and whose later runs do (a marker
/// on its volume), with `onFailure: restart` under `restartPolicy: Never`. It leaves on
/// SIGTERM at once (a shell as PID 1 would ignore it).
pub(crate) fn restarted_when_unhealthy(image: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: hung
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 1
  restartPolicy:
    condition: Never
  container:
    command: [\"/bin/sh\", \"-c\", \"if [ -e /data/started ]; then touch /tmp/healthy; fi; touch /data/started; trap 'exit 0' TERM; while true; do sleep 1; done\"]
    volumeMounts:
      - name: data
        mountPath: /data
  volumes:
    - name: data
      simpleClusterStorage: {{}}
"
            ),
        ),
        (
            "VirtualLoadBalancer.kat",
            "apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8080
  healthCheck:
    exec:
      command: [\"/bin/sh\", \"-c\", \"test -e /tmp/healthy\"]
    initialDelaySeconds: 0
    periodSeconds: 1
    failureThreshold: 2
    onFailure: restart
"
            .to_string(),
        ),
    ]
}

/// A Service that asks for `count` AMD GPUs.
pub(crate) fn gpu_workload(name: &str, image: &str, count: u32) -> Vec<(&'static str, String)> {
    vec![(
        "workload.kat",
        format!(
            "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: {name}
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 1
  restartPolicy:
    condition: Always
  container:
    command: [\"/bin/sh\", \"-c\", \"exec sleep 3600\"]
    resources:
      gpu:
        driver: amd
        minVRAM_MB: 4096
        count: {count}
"
        ),
    )]
}
