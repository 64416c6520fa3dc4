//! Any bytes as an uploaded bundle: never a panic, and whatever unpacks obeys the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = kat_api::bundle::BundleLimits::default();
    if let Ok(files) = kat_api::bundle::unpack(data, &limits) {
        assert!(files.len() <= limits.max_files);
        assert!(files.values().map(|f| f.len() as u64).sum::<u64>() <= limits.max_total_file_bytes);
        for name in files.keys() {
            assert!(name.ends_with(".kat") && !name.contains('/') && !name.contains(".."), "{name}");
        }
        let _ = kat_api::WorkloadBundle::parse(files);
    }
});
