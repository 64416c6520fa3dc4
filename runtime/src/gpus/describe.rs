//! What a GPU is (driver, model, memory), from what the kernel shows of the device nodes its
//! CDI specification names:
//! - `/dev/nvidiaN` → `/proc/driver/nvidia/gpus/*/information` with `Device Minor: N`
//!   (`Model:`); its memory from `nvidia-smi` where the root is the real one;
//! - `/dev/dri/renderDN`, `/dev/dri/cardN` → `/sys/class/drm/<node>/device/`: `vendor`
//!   (0x10de NVIDIA, 0x1002 AMD), `mem_info_vram_total` (amdgpu), `product_name`;
//! - otherwise the CDI kind's vendor (`nvidia.com`, `amd.com`), with no model or memory.

use std::path::Path;

use kat_api::wire::GpuInfo;
use kat_api::workload::GpuDriver;

use super::cdi;

/// The GPU a CDI device is, if it is one KAT can offer.
pub fn gpu(root: &Path, kind: &str, device: &cdi::Device) -> Option<GpuInfo> {
    let by_vendor = match kind.split('/').next() {
        Some("nvidia.com") => Some(GpuDriver::Nvidia),
        Some("amd.com") => Some(GpuDriver::Amd),
        _ => None,
    };
    for node in &device.container_edits.device_nodes {
        let path = node.host_path.as_deref().unwrap_or(&node.path);
        let base = path.rsplit('/').next().unwrap_or_default();
        if let Some(minor) = base
            .strip_prefix("nvidia")
            .and_then(|m| m.parse::<u32>().ok())
        {
            let (model, vram_mb) = nvidia(root, minor);
            return Some(GpuInfo {
                driver: GpuDriver::Nvidia,
                vram_mb,
                model,
                device: String::new(),
            });
        }
        if base.starts_with("renderD") || base.starts_with("card") {
            if let Some(gpu) = drm(root, base) {
                return Some(gpu);
            }
        }
    }
    by_vendor.map(|driver| GpuInfo {
        driver,
        vram_mb: 0,
        model: String::new(),
        device: String::new(),
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// An NVIDIA GPU by its device minor: its model from /proc, its memory from nvidia-smi.
fn nvidia(root: &Path, minor: u32) -> (String, u32) {
    let mut model = String::new();
    if let Ok(entries) = std::fs::read_dir(root.join("proc/driver/nvidia/gpus")) {
        for e in entries.flatten() {
            let Some(info) = read(&e.path().join("information")) else {
                continue;
            };
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start_matches(':').trim().to_string())
            };
            if field("Device Minor").and_then(|m| m.parse::<u32>().ok()) == Some(minor) {
                model = field("Model").unwrap_or_default();
            }
        }
    }
    let vram_mb = if root == Path::new("/") {
        nvidia_smi_memory(minor).unwrap_or(0)
    } else {
        0
    };
    (model, vram_mb)
}

/// `nvidia-smi`'s total memory (MiB) of the GPU with that minor, if it answers within 5 s
/// (a wedged driver must not hold the agent's start).
fn nvidia_smi_memory(minor: u32) -> Option<u32> {
    use std::io::Read;
    let mut child = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=minor_number,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("nvidia-smi did not answer within 5 s; GPU memory unknown");
                return None;
            }
        }
    }
    let mut text = String::new();
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    text.lines().find_map(|l| {
        let (m, mem) = l.split_once(',')?;
        (m.trim().parse::<u32>().ok()? == minor).then(|| mem.trim().parse().ok())?
    })
}

/// A DRM device (`renderD128`, `card0`) from sysfs.
fn drm(root: &Path, node: &str) -> Option<GpuInfo> {
    let dev = root.join("sys/class/drm").join(node).join("device");
    let driver = match read(&dev.join("vendor"))?.as_str() {
        "0x10de" => GpuDriver::Nvidia,
        "0x1002" => GpuDriver::Amd,
        _ => return None,
    };
    let vram_mb = read(&dev.join("mem_info_vram_total"))
        .and_then(|b| b.parse::<u64>().ok())
        .map_or(0, |b| u32::try_from(b >> 20).unwrap_or(u32::MAX));
    Some(GpuInfo {
        driver,
        vram_mb,
        model: read(&dev.join("product_name")).unwrap_or_default(),
        device: String::new(),
    })
}

/// GPUs the kernel shows that no CDI device covers (said in the log: no container can have
/// them without a specification).
pub fn without_spec(root: &Path, found: &[GpuInfo]) -> Vec<String> {
    let mut seen = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root.join("sys/class/drm")) {
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("renderD"))
            .collect();
        names.sort();
        for n in names {
            if let Some(g) = drm(root, &n) {
                seen.push((format!("{:?} GPU {n} {}", g.driver, g.model), g));
            }
        }
    }
    let offered = found.len();
    // Without a reliable link from every CDI device to its sysfs node, count: more GPUs in
    // sysfs than offered means some have no specification.
    seen.into_iter()
        .skip(offered)
        .map(|(text, _)| text)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn device(paths: &[&str]) -> cdi::Device {
        cdi::Device {
            name: "0".into(),
            container_edits: cdi::ContainerEdits {
                device_nodes: paths
                    .iter()
                    .map(|p| cdi::DeviceNode {
                        path: p.to_string(),
                        host_path: None,
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn amd_from_sysfs_nvidia_from_proc_and_others_by_vendor() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "sys/class/drm/renderD128/device/vendor", "0x1002\n");
        write(
            root,
            "sys/class/drm/renderD128/device/mem_info_vram_total",
            "8589934592\n",
        );
        write(
            root,
            "sys/class/drm/renderD128/device/product_name",
            "Kat Test GPU\n",
        );
        write(
            root,
            "proc/driver/nvidia/gpus/0000:01:00.0/information",
            "Model: \t\t NVIDIA Test 4090\nIRQ: 1\nDevice Minor: \t 1\n",
        );
        let amd = gpu(
            root,
            "kat.test/gpu",
            &device(&["/dev/kfd", "/dev/dri/renderD128"]),
        )
        .unwrap();
        assert_eq!(
            (amd.driver, amd.vram_mb, amd.model.as_str()),
            (GpuDriver::Amd, 8192, "Kat Test GPU")
        );
        let nv = gpu(root, "nvidia.com/gpu", &device(&["/dev/nvidia1"])).unwrap();
        assert_eq!(
            (nv.driver, nv.model.as_str()),
            (GpuDriver::Nvidia, "NVIDIA Test 4090")
        );
        let by_kind = gpu(root, "amd.com/gpu", &device(&["/dev/dri/renderD200"])).unwrap();
        assert_eq!((by_kind.driver, by_kind.vram_mb), (GpuDriver::Amd, 0));
        assert!(gpu(root, "kat.test/fpga", &device(&["/dev/fpga0"])).is_none());
        assert_eq!(without_spec(root, &[]).len(), 1);
        assert!(without_spec(root, &[amd]).is_empty());
    }
}
