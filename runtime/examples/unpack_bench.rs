//! What unpacking a layer costs: KAT's unpack in the agent's process (by descriptor), the
//! same in the unpack sandbox (a helper that is root of the reserved id slice, then the id
//! shift back to the store's owner), and GNU tar (`tar -xzf`) as the peer, on the same
//! layer, in one run. Driven by `bench/unpack.sh`.
//!
//! The layer looks like a distribution's: a few hundred directories, a few thousand files
//! of 0–64 KiB (deterministic contents, half of them compressible), symlinks and hard links.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kat_runtime::idmap::{IdMap, NodeIdRange};
use kat_runtime::image::layer::{self, Ownership};
use kat_runtime::image::limits::Budget;
use kat_runtime::image::unpack_sandbox::UnpackSandbox;
use kat_runtime::image::UnpackLimits;
use kat_runtime::tree_dir::remove_tree;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run bench/unpack.sh"))
}

/// A gzip layer of `dirs` directories with `files` files in all; its unpacked bytes.
fn make_layer(path: &Path, dirs: usize, files: usize) -> u64 {
    let out = std::fs::File::create(path).expect("create the layer");
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut bytes = 0;
    for d in 0..dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        tar.append_data(&mut h, format!("usr/lib/d{d}/"), std::io::empty())
            .expect("append a directory");
    }
    for f in 0..files {
        let size = (next() % (64 << 10)) as usize;
        let data: Vec<u8> = if f % 2 == 0 {
            (0..size).map(|i| (i % 251) as u8).collect()
        } else {
            (0..size).map(|_| next() as u8).collect()
        };
        bytes += size as u64;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(if f % 7 == 0 { 0o755 } else { 0o644 });
        h.set_uid((f % 3) as u64 * 1000);
        h.set_gid((f % 3) as u64 * 1000);
        h.set_size(size as u64);
        let name = format!("usr/lib/d{}/f{f}", f % dirs);
        tar.append_data(&mut h, &name, data.as_slice())
            .expect("append a file");
        if f % 10 == 0 {
            let mut l = tar::Header::new_gnu();
            l.set_entry_type(tar::EntryType::Symlink);
            l.set_mode(0o777);
            l.set_size(0);
            tar.append_link(
                &mut l,
                format!("usr/lib/d{}/s{f}", f % dirs),
                format!("f{f}"),
            )
            .expect("append a symlink");
        }
        if f % 25 == 0 {
            let mut l = tar::Header::new_gnu();
            l.set_entry_type(tar::EntryType::Link);
            l.set_size(0);
            tar.append_link(&mut l, format!("usr/lib/d{}/h{f}", f % dirs), &name)
                .expect("append a hard link");
        }
    }
    let gz = tar.into_inner().expect("finish the tar");
    gz.finish()
        .expect("finish the gzip")
        .flush()
        .expect("flush");
    bytes
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn timed(runs: usize, dir: &Path, mut once: impl FnMut(&Path)) -> f64 {
    let mut times = Vec::new();
    for i in 0..runs {
        let dest = dir.join(format!("run{i}"));
        let t = Instant::now();
        once(&dest);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        remove_tree(&dest).expect("remove the unpacked tree");
    }
    median(times)
}

fn main() {
    let dir = PathBuf::from(env("BENCH_DIR"));
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let helper = PathBuf::from(env("KAT_RUNTIME_HELPER"));
    let layer = dir.join("layer.tar.gz");
    let bytes = make_layer(&layer, 300, 3000);
    let blob_size = std::fs::metadata(&layer).expect("layer").len();
    println!(
        "layer: 3000 files, 300 directories, 300 symlinks, 120 hard links; {:.1} MiB unpacked, {:.1} MiB compressed",
        bytes as f64 / 1048576.0,
        blob_size as f64 / 1048576.0
    );
    let budget = || Budget::new("bench", UnpackLimits::default());
    let ids = IdMap::identity();
    let ownership = if nix::unistd::geteuid().is_root() {
        Ownership::Mapped(&ids)
    } else {
        Ownership::Squashed
    };
    let in_process = timed(runs, &dir, |dest| {
        let file = std::fs::File::open(&layer).expect("open the layer");
        layer::unpack(file, dest, ownership, "sha256:bench", &mut budget()).expect("unpack");
    });
    let range = NodeIdRange::for_current_user().expect("a subuid range for this user");
    let sandbox = UnpackSandbox::new(helper, range).expect("a range with a slice to spare");
    let sandboxed = timed(runs, &dir, |dest| {
        sandbox
            .unpack(&layer, dest, "sha256:bench", &mut budget())
            .expect("sandboxed unpack");
    });
    let tar = timed(runs, &dir, |dest| {
        std::fs::create_dir(dest).expect("mkdir");
        let ok = Command::new("tar")
            .arg("-xzf")
            .arg(&layer)
            .arg("-C")
            .arg(dest)
            .status()
            .expect("run tar");
        assert!(ok.success(), "tar failed");
    });
    println!("in-process: {in_process:8.1} ms (median of {runs})");
    println!("sandboxed:  {sandboxed:8.1} ms");
    println!("GNU tar:    {tar:8.1} ms");
    println!(
        "unpack_ms in_process={in_process:.0} sandboxed={sandboxed:.0} tar={tar:.0} sandboxed/in_process={:.2} sandboxed/tar={:.2}",
        sandboxed / in_process,
        sandboxed / tar
    );
}
