//! Bundle packing and hostile archives. Malicious archives are built by hand with raw tar
//! headers, because a well-behaved tar writer refuses to produce them.

use std::collections::BTreeMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use kat_api::bundle::{pack, pack_dir, read_dir, unpack, unpack_to_dir, BundleError, BundleLimits};

const WORKLOAD: &[u8] = b"apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {name: w}\nspec:\n  type: Service\n  replicas: 1\n  source: {image: busybox}\n  restartPolicy: {condition: Always}\n  container: {}\n";

/// A raw tar entry: name written into the header verbatim, any type byte, optional link name.
struct Raw<'a> {
    name: &'a [u8],
    kind: u8,
    data: &'a [u8],
    link: &'a [u8],
}

fn raw_tar(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = [0u8; 512];
        h[..e.name.len()].copy_from_slice(e.name);
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", e.data.len()).as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = e.kind;
        h[157..157 + e.link.len()].copy_from_slice(e.link);
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(e.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn file<'a>(name: &'a [u8], data: &'a [u8]) -> Raw<'a> {
    Raw {
        name,
        kind: b'0',
        data,
        link: b"",
    }
}

fn unpack_raw(entries: &[Raw<'_>]) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    unpack(&gz(&raw_tar(entries)), &BundleLimits::default())
}

#[test]
fn pack_and_unpack_round_trip_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("workload.kat"), WORKLOAD).unwrap();
    std::fs::write(dir.path().join("README.md"), "not packed").unwrap();
    let a = pack_dir(dir.path()).unwrap();
    let b = pack_dir(dir.path()).unwrap();
    assert_eq!(a, b, "same files must give the same archive");
    let files = unpack(&a, &BundleLimits::default()).unwrap();
    assert_eq!(files.keys().collect::<Vec<_>>(), ["workload.kat"]);
    assert_eq!(files["workload.kat"], WORKLOAD);
}

#[test]
fn pack_dir_refuses_symlinks_and_empty_dirs() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_dir(dir.path()),
        Err(BundleError::NoQuadlets(_))
    ));
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("workload.kat")).unwrap();
    let err = pack_dir(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            BundleError::NotRegularSource {
                what: "symbolic link",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("workload.kat is a symbolic link"),
        "{err}"
    );
}

#[test]
fn accepts_leading_dot_slash_and_root_dir_entry() {
    let files = unpack_raw(&[
        Raw {
            name: b"./",
            kind: b'5',
            data: b"",
            link: b"",
        },
        file(b"./workload.kat", WORKLOAD),
    ])
    .unwrap();
    assert!(files.contains_key("workload.kat"));
}

#[test]
fn rejects_path_traversal() {
    let err = unpack_raw(&[file(b"../evil.kat", b"x")]).unwrap_err();
    assert!(matches!(err, BundleError::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("'..' is not allowed"));
    let err = unpack_raw(&[file(b"/etc/evil.kat", b"x")]).unwrap_err();
    assert!(
        err.to_string().contains("absolute paths are not allowed"),
        "{err}"
    );
    let err = unpack_raw(&[file(b"sub/workload.kat", b"x")]).unwrap_err();
    assert!(err.to_string().contains("top level"), "{err}");
    let err = unpack_raw(&[file(b"a/../../x.kat", b"x")]).unwrap_err();
    assert!(matches!(err, BundleError::UnsafePath { .. }), "{err}");
}

#[test]
fn rejects_links_devices_and_fifos() {
    for (kind, what) in [
        (b'2', "symbolic link"),
        (b'1', "hard link"),
        (b'3', "device"),
        (b'4', "device"),
        (b'6', "FIFO"),
    ] {
        let err = unpack_raw(&[
            file(b"workload.kat", WORKLOAD),
            Raw {
                name: b"link.kat",
                kind,
                data: b"",
                link: b"/etc/passwd",
            },
        ])
        .unwrap_err();
        assert!(
            matches!(&err, BundleError::NotRegularFile { what: w, .. } if *w == what),
            "{kind}: {err}"
        );
    }
    let err = unpack_raw(&[Raw {
        name: b"dir.kat",
        kind: b'5',
        data: b"",
        link: b"",
    }])
    .unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[test]
fn rejects_non_quadlet_and_duplicate_names() {
    assert!(matches!(
        unpack_raw(&[file(b"run.sh", b"#!/bin/sh")]).unwrap_err(),
        BundleError::NotQuadlet { .. }
    ));
    assert!(matches!(
        unpack_raw(&[file(b"a.kat", b"1"), file(b"./a.kat", b"2")]).unwrap_err(),
        BundleError::Duplicate { .. }
    ));
    assert!(matches!(unpack_raw(&[]).unwrap_err(), BundleError::Empty));
}

#[test]
fn enforces_size_and_count_limits() {
    let limits = BundleLimits {
        max_files: 2,
        max_file_bytes: 100,
        max_total_file_bytes: 150,
        ..BundleLimits::default()
    };
    let names: Vec<Vec<u8>> = (0..3).map(|i| format!("f{i}.kat").into_bytes()).collect();
    let many: Vec<Raw<'_>> = names.iter().map(|n| file(n, b"x")).collect();
    assert!(matches!(
        unpack(&gz(&raw_tar(&many)), &limits).unwrap_err(),
        BundleError::TooManyFiles { limit: 2 }
    ));
    let big = vec![b'a'; 101];
    assert!(matches!(
        unpack(&gz(&raw_tar(&[file(b"a.kat", &big)])), &limits).unwrap_err(),
        BundleError::FileTooLarge { size: 101, .. }
    ));
    let eighty = vec![b'a'; 80];
    let err = unpack(
        &gz(&raw_tar(&[
            file(b"a.kat", &eighty),
            file(b"b.kat", &eighty),
        ])),
        &limits,
    )
    .unwrap_err();
    assert!(
        matches!(err, BundleError::TotalTooLarge { limit: 150 }),
        "{err}"
    );
    let compressed = vec![0u8; (1 << 20) + 1];
    assert!(matches!(
        unpack(&compressed, &BundleLimits::default()).unwrap_err(),
        BundleError::TooLarge { .. }
    ));
}

#[test]
fn stops_a_compression_bomb_early() {
    // A PAX extended header is read into memory by tar readers; one of 64 MiB compresses to
    // ~64 KiB. The decompression cap must trip long before it is inflated.
    let huge = vec![b'a'; 64 << 20];
    let bomb = gz(&raw_tar(&[
        Raw {
            name: b"pax",
            kind: b'x',
            data: &huge,
            link: b"",
        },
        file(b"a.kat", WORKLOAD),
    ]));
    assert!(
        bomb.len() < 1 << 20,
        "the bomb must pass the compressed-size limit"
    );
    let err = unpack(&bomb, &BundleLimits::default()).unwrap_err();
    assert!(
        matches!(err, BundleError::DecompressedTooLarge { limit } if limit == 2 << 20),
        "{err}"
    );
    // The same for a GNU long-name entry.
    let bomb = gz(&raw_tar(&[
        Raw {
            name: b"././@LongLink",
            kind: b'L',
            data: &huge,
            link: b"",
        },
        file(b"a.kat", WORKLOAD),
    ]));
    assert!(matches!(
        unpack(&bomb, &BundleLimits::default()).unwrap_err(),
        BundleError::DecompressedTooLarge { .. }
    ));
}

#[test]
fn corrupt_archives_are_clear_errors() {
    assert!(matches!(
        unpack(b"definitely not gzip", &BundleLimits::default()).unwrap_err(),
        BundleError::Corrupt(_)
    ));
    let mut good = pack(&BTreeMap::from([("w.kat".to_string(), WORKLOAD.to_vec())]));
    good.truncate(good.len() / 2);
    assert!(unpack(&good, &BundleLimits::default()).is_err());
}

#[test]
fn malicious_archive_writes_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let target = parent.path().join("bundle");
    let evil = gz(&raw_tar(&[
        file(b"workload.kat", WORKLOAD),
        file(b"../escape.kat", b"x"),
    ]));
    assert!(unpack_to_dir(&evil, &target, &BundleLimits::default()).is_err());
    assert_eq!(
        std::fs::read_dir(parent.path()).unwrap().count(),
        0,
        "nothing may be written"
    );
    let good = pack(&BTreeMap::from([(
        "workload.kat".to_string(),
        WORKLOAD.to_vec(),
    )]));
    unpack_to_dir(&good, &target, &BundleLimits::default()).unwrap();
    assert_eq!(
        std::fs::read(target.join("workload.kat")).unwrap(),
        WORKLOAD
    );
    assert_eq!(
        std::fs::read_dir(parent.path()).unwrap().count(),
        1,
        "no staging directory left behind"
    );
}
