//! Any bytes as a Quadlet file, alone and as a one-file bundle: never a panic, and every
//! failure carries at least one finding naming the file.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut report = kat_api::Report::new();
    let _ = kat_api::parse_file("fuzz.kat", data, &mut report);
    if let Err(e) = kat_api::WorkloadBundle::parse(BTreeMap::from([("workload.kat".to_string(), data.to_vec())])) {
        assert!(!e.0.is_empty(), "an error must carry findings");
    }
    let _ = kat_api::parse_cluster("cluster.kat", data);
});
