//! Every validation rule, positive and negative, through the public entry points.

use std::collections::BTreeMap;

use kat_api::{parse_cluster, WorkloadBundle};
use yaml_serde::Value;

mod bundle;
mod cluster;
mod load_balancer_and_build;
mod schema;
mod workload;

const WORKLOAD: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: web
spec:
  type: Service
  source:
    image: registry.local:5000/web:1.0
  replicas: 2
  updateStrategy:
    type: Rolling
    rolling:
      maxSurge: 1
  restartPolicy:
    condition: MaxCount
    maxRestarts: 3
    resetSeconds: 600
  nodeSelector:
    disk: ssd
  tolerations:
    - key: gpu
      operator: Exists
      effect: NoSchedule
  container:
    name: main
    command: ["/bin/server"]
    args: ["--port", "8080"]
    env:
      - name: MODE
        value: prod
    volumeMounts:
      - name: data
        mountPath: /data
        subPath: web
      - name: config
        mountPath: /etc/web
        readOnly: true
    resources:
      requests:
        cpu: 100m
        memory: 64Mi
      limits:
        cpu: "1"
        memory: 256Mi
      gpu:
        driver: nvidia
        minVRAM_MB: 1024
  volumes:
    - name: data
      simpleClusterStorage: {}
    - name: config
      hostMount:
        hostPath: /etc/web
        ensureType: DirectoryOrCreate
"#;

const LB: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8080
    - name: dns
      containerPort: 53
      protocol: UDP
  healthCheck:
    exec:
      command: ["/bin/check"]
    initialDelaySeconds: 2
    periodSeconds: 5
  ingress:
    - host: web.example.com
      servicePortName: http
    - host: alt.example.com
      path: /api
      servicePort: 8080
      tls: true
"#;

const JOB: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: JobDefinition
spec:
  schedule: "*/5 * * * *"
  completions: 3
  parallelism: 2
  activeDeadlineSeconds: 600
  backoffLimit: 2
"#;

const BUILD: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: BuildDefinition
spec:
  buildContext: ./app
  dockerfilePath: Dockerfile
  buildArgs:
    VERSION: "1.2.3"
  targetStage: runtime
  platform: linux/arm64
  cache:
    registryPath: registry.local:5000/cache/web
"#;

const CLUSTER: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: home
spec:
  clusterCIDR: 10.100.0.0/16
  serviceCIDR: 10.200.0.0/16
"#;

fn yaml(s: &str) -> Value {
    yaml_serde::from_str(s).unwrap()
}

/// Set (or with `Value::Null` as value and `remove`, delete) a dotted path such as
/// `spec.container.resources.limits.memory` or `spec.volumes.0.name`.
fn set(doc: &mut Value, path: &str, value: Option<Value>) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur = doc;
    for part in &parts[..parts.len() - 1] {
        cur = match part.parse::<usize>() {
            Ok(i) => &mut cur.as_sequence_mut().unwrap()[i],
            Err(_) => {
                let map = cur.as_mapping_mut().unwrap();
                map.entry(Value::from(*part))
                    .or_insert_with(|| Value::Mapping(Default::default()))
            }
        };
    }
    let last = parts[parts.len() - 1];
    match (last.parse::<usize>(), value) {
        (Ok(i), Some(v)) => cur.as_sequence_mut().unwrap()[i] = v,
        (Ok(i), None) => {
            cur.as_sequence_mut().unwrap().remove(i);
        }
        (Err(_), Some(v)) => {
            cur.as_mapping_mut().unwrap().insert(Value::from(last), v);
        }
        (Err(_), None) => {
            cur.as_mapping_mut().unwrap().remove(last);
        }
    }
}

fn files(list: &[(&str, &Value)]) -> BTreeMap<String, Vec<u8>> {
    list.iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                yaml_serde::to_string(v).unwrap().into_bytes(),
            )
        })
        .collect()
}

fn findings(list: &[(&str, &Value)]) -> Vec<String> {
    match WorkloadBundle::parse(files(list)) {
        Ok(_) => vec![],
        Err(e) => e.0.findings().iter().map(|f| f.to_string()).collect(),
    }
}

fn service_with(path: &str, value: Option<&str>) -> Vec<String> {
    let mut w = yaml(WORKLOAD);
    set(&mut w, path, value.map(yaml));
    findings(&[("workload.kat", &w), ("VirtualLoadBalancer.kat", &yaml(LB))])
}

#[track_caller]
fn assert_finding(found: &[String], expected: &str) {
    assert!(
        found.iter().any(|f| f.contains(expected)),
        "expected a finding containing {expected:?}, got {found:#?}"
    );
}

#[track_caller]
fn assert_valid(found: &[String]) {
    assert!(found.is_empty(), "expected no findings, got {found:#?}");
}
