use super::*;
use serde_json::Value;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn docker_entrypoint_and_cmd_rules() {
    let image = RunConfig {
        entrypoint: s(&["/entry"]),
        cmd: s(&["default"]),
        ..Default::default()
    };
    assert_eq!(workload_argv(&image, &[], &[]), s(&["/entry", "default"]));
    assert_eq!(workload_argv(&image, &[], &s(&["x"])), s(&["/entry", "x"]));
    assert_eq!(
        workload_argv(&image, &s(&["/bin/sh"]), &[]),
        s(&["/bin/sh"])
    );
    assert_eq!(
        workload_argv(&image, &s(&["/bin/sh"]), &s(&["-c", "true"])),
        s(&["/bin/sh", "-c", "true"])
    );
}

#[test]
fn env_overrides_image() {
    let image = RunConfig {
        env: s(&["PATH=/app/bin", "A=1"]),
        ..Default::default()
    };
    let env = merged_env(
        &image,
        &BTreeMap::from([("A".to_string(), "2".to_string())]),
        "h",
    );
    assert_eq!(env, s(&["A=2", "HOSTNAME=h", "PATH=/app/bin"]));
}

/// `config.json` for three kinds of container, against the files under
/// `runtime/tests/spec_golden/` (compared as JSON, where an absent field, `null`, `false`
/// and an empty list or object mean the same to the runtime). `KAT_BLESS=1` rewrites them.
#[test]
fn config_json_matches_the_golden_files() {
    let options = CreateOptions {
        id: "web-1a".into(),
        log: crate::types::LogConfig {
            max_bytes: 1 << 20,
            max_files: 3,
        },
        resources: Resources {
            memory_limit_bytes: 256 << 20,
            cpu_limit_millis: 500,
            cpu_request_millis: 250,
            pids_limit: 512,
        },
        volumes: vec![
            crate::types::VolumeMount {
                name: "data".into(),
                source: "/srv/data".into(),
                sub_path: None,
                destination: "/data".into(),
                read_only: false,
                ..Default::default()
            },
            crate::types::VolumeMount {
                name: "conf".into(),
                source: "/srv/conf".into(),
                sub_path: None,
                destination: "/etc/app".into(),
                read_only: true,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let ids = IdMap {
        uids: vec![crate::idmap::IdRange {
            inside: 0,
            outside: 100_000,
            count: 65_536,
        }],
        gids: vec![crate::idmap::IdRange {
            inside: 0,
            outside: 100_000,
            count: 65_536,
        }],
    };
    let dir = Path::new("/var/lib/kat/containers/web-1a");
    let (etc, logs) = (dir.join("etc"), dir.join("logs"));
    let (mountpoint, lower, upper, work) = (
        dir.join("rootfs"),
        PathBuf::from("/var/lib/kat/slots/3/img"),
        dir.join("upper"),
        dir.join("work"),
    );
    let input = |name: &str| SpecInput {
        options: &options,
        hostname: "web-1a",
        argv: s(&["/bin/app", "--port", "8080"]),
        env: s(&["HOSTNAME=web-1a", "PATH=/bin"]),
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        ids: &ids,
        rootfs: if name == "copy" {
            Rootfs::Copy(&mountpoint)
        } else {
            Rootfs::Overlay {
                mountpoint: &mountpoint,
                lower: &lower,
                upper: &upper,
                work: &work,
            }
        },
        init_binary: Path::new("/usr/lib/kat/kat-init"),
        kat_dir: Path::new("/var/lib/kat/containers/web-1a/kat"),
        etc_dir: &etc,
        log_dir: &logs,
        volume_sources: vec!["/srv/data".into(), "/srv/conf/sub".into()],
        cgroups_path: Some("kat.slice:kat:web-1a".into()),
        memory_limit: name != "copy",
        cpu_limit: name != "copy",
        pids_limit: true,
        omit_resources: name == "joined",
        seccomp: name != "copy",
        cgroup_mount: name == "joined",
        joined: (name == "joined").then(|| {
            (
                PathBuf::from("/proc/4242/ns/user"),
                PathBuf::from("/proc/4242/ns/net"),
            )
        }),
    };
    const CAPABILITY_SETS: [&str; 5] = [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ];
    fn normal(v: Value) -> Option<Value> {
        match v {
            Value::Null | Value::Bool(false) => None,
            Value::Array(a) if a.is_empty() => None,
            Value::Object(o) => {
                let o: serde_json::Map<String, Value> = o
                    .into_iter()
                    .filter_map(|(k, v)| {
                        let mut v = normal(v)?;
                        // Capability sets are sets: their order means nothing.
                        if let (true, Value::Array(a)) =
                            (CAPABILITY_SETS.contains(&k.as_str()), &mut v)
                        {
                            a.sort_by_key(|c| c.to_string());
                        }
                        Some((k, v))
                    })
                    .collect();
                (!o.is_empty()).then_some(Value::Object(o))
            }
            Value::Array(a) => Some(Value::Array(a.into_iter().filter_map(normal).collect())),
            v => Some(v),
        }
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/spec_golden");
    for name in ["overlay", "copy", "joined"] {
        let built = serde_json::to_value(build(&input(name)).unwrap()).unwrap();
        let file = golden.join(format!("{name}.json"));
        if std::env::var_os("KAT_BLESS").is_some() {
            std::fs::write(&file, serde_json::to_vec_pretty(&built).unwrap()).unwrap();
        }
        let want: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            normal(built),
            normal(want),
            "config.json of the {name} case differs from {}",
            file.display()
        );
    }
}

/// A device node is bound in without `nodev` and allowed in the device cgroup by its own
/// type and numbers (read from the host's node); a path that is no device gets no rule.
#[test]
fn devices_are_bound_in_and_allowed_by_number() {
    let null = crate::types::DeviceNode {
        host_path: "/dev/null".into(),
        container_path: "/dev/dri/renderD128".into(),
    };
    let m = device_mount(&null);
    assert_eq!(m.destination(), Path::new("/dev/dri/renderD128"));
    let options = m.options().clone().unwrap_or_default();
    assert!(!options.iter().any(|o| o == "nodev"), "{options:?}");
    assert!(options.iter().any(|o| o == "nosuid"), "{options:?}");
    let rules = device_rules(&[
        null,
        crate::types::DeviceNode {
            host_path: "/etc/hostname".into(),
            container_path: "/dev/x".into(),
        },
    ]);
    assert_eq!(rules.len(), 2, "{rules:?}");
    let r = &rules[1];
    assert!(r.allow());
    assert_eq!((r.major(), r.minor()), (Some(1), Some(3)));
    assert_eq!(r.access().as_deref(), Some("rwm"));
    // Every container's list starts by denying all devices (a v1 cgroup would otherwise
    // inherit its parent's `a *:* rwm`).
    for rules in [rules, device_rules(&[])] {
        let first = &rules[0];
        assert!(!first.allow(), "{first:?}");
        assert_eq!(first.typ(), Some(LinuxDeviceType::A));
        assert_eq!(first.access().as_deref(), Some("rwm"));
    }
}

/// CDI hooks become the OCI hooks of their stage, in order, with their arguments,
/// environment and timeout; no hooks, no `hooks` in the spec.
#[test]
fn hooks_go_to_their_stage() {
    use crate::types::{Hook, HookStage};
    let hook = |stage, path: &str| Hook {
        stage,
        path: path.into(),
        args: vec!["mark".into(), "created".into()],
        env: vec!["A=1".into()],
        timeout: Some(5),
    };
    let spec = hooks(&[
        hook(HookStage::CreateRuntime, "/usr/bin/first"),
        hook(HookStage::Poststop, "/usr/bin/last"),
        hook(HookStage::CreateRuntime, "/usr/bin/second"),
    ])
    .unwrap();
    let runtime = spec.create_runtime().clone().unwrap();
    let paths: Vec<_> = runtime.iter().map(|h| h.path().clone()).collect();
    assert_eq!(
        paths,
        [PathBuf::from("/usr/bin/first"), "/usr/bin/second".into()]
    );
    assert_eq!(
        runtime[0].args().as_deref(),
        Some(&["mark".to_string(), "created".into()][..])
    );
    assert_eq!(runtime[0].env().as_deref(), Some(&["A=1".to_string()][..]));
    assert_eq!(runtime[0].timeout(), Some(5));
    assert_eq!(spec.poststop().as_ref().map(Vec::len), Some(1));
    assert!(spec.create_container().is_none() && spec.poststart().is_none());
    assert!(hooks(&[]).is_none());
}
