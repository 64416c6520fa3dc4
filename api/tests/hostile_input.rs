//! The fuzz targets' properties on stable Rust, so CI checks them on every run:
//! arbitrary and mutated input never panics the parsers or the unpacker.

use std::collections::BTreeMap;

use kat_api::bundle::{pack, unpack, BundleLimits};
use proptest::prelude::*;

const SEED: &str = include_str!("../../examples/hello/workload.kat");

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut report = kat_api::Report::new();
        let _ = kat_api::parse_file("x.kat", &data, &mut report);
        let _ = kat_api::parse_cluster("cluster.kat", &data);
        let _ = unpack(&data, &BundleLimits::default());
    }

    #[test]
    fn mutated_quadlets_never_panic(pos in 0..SEED.len(), byte in any::<u8>(), cut in 0..SEED.len()) {
        let mut data = SEED.as_bytes().to_vec();
        data[pos] = byte;
        data.truncate(cut.max(pos + 1));
        let files = BTreeMap::from([("workload.kat".to_string(), data)]);
        if let Err(e) = kat_api::WorkloadBundle::parse(files) {
            prop_assert!(!e.0.is_empty());
        }
    }

    #[test]
    fn mutated_archives_never_panic(pos in 0usize..4096, byte in any::<u8>()) {
        let mut archive = pack(&BTreeMap::from([("workload.kat".to_string(), SEED.as_bytes().to_vec())]));
        let pos = pos % archive.len();
        archive[pos] = byte;
        let _ = unpack(&archive, &BundleLimits::default());
    }
}
