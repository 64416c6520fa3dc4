//! Image pulls under way on this node. They run beside convergence, one per reference
//! however many instances wait for it, so one slow registry never delays another
//! instance's restart, stop or probe. Each keeps the progress the runtime reports (layers
//! and bytes), which the waiting instances' status carries to the leader, to
//! `katcall describe` and to `katcall apply --wait`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kat_api::wire::PullStatus;
use kat_runtime::{ContainerRuntime, PullProgress};
use tokio::sync::mpsc;

enum Pull {
    Running(PullStatus),
    /// Its error, taken by the next attempt (which starts the pull again).
    Failed(String),
}

/// Where the pull of one reference is.
pub(super) enum PullState {
    /// None runs: start one.
    Absent,
    Running(PullStatus),
    Failed(String),
}

#[derive(Clone, Default)]
pub(super) struct Pulls(Arc<Mutex<HashMap<String, Pull>>>);

impl Pulls {
    /// The pull of `normalized`; a failure is taken (reported once, then tried again).
    pub(super) fn state(&self, normalized: &str) -> PullState {
        let Ok(mut table) = self.0.lock() else {
            return PullState::Failed("the pull table is poisoned".into());
        };
        match table.get(normalized) {
            None => PullState::Absent,
            Some(Pull::Running(status)) => PullState::Running(coarse(status)),
            Some(Pull::Failed(_)) => match table.remove(normalized) {
                Some(Pull::Failed(e)) => PullState::Failed(e),
                _ => PullState::Absent,
            },
        }
    }

    /// Starts pulling `image` (normalized: `normalized`) in the background; its progress
    /// shows in [`Pulls::state`] until it ends, when it leaves the table (done: the image is
    /// in the store) or stays as its error.
    pub(super) fn start(
        &self,
        runtime: Arc<dyn ContainerRuntime>,
        image: &str,
        normalized: String,
    ) -> PullStatus {
        let status = PullStatus {
            image: image.to_string(),
            ..Default::default()
        };
        if let Ok(mut table) = self.0.lock() {
            table.insert(normalized.clone(), Pull::Running(status.clone()));
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let table = self.0.clone();
        let key = normalized.clone();
        let follow = tokio::spawn(async move {
            let mut layer_bytes = HashMap::new();
            while let Some(event) = rx.recv().await {
                let Ok(mut table) = table.lock() else { return };
                if let Some(Pull::Running(status)) = table.get_mut(&key) {
                    fold(status, &mut layer_bytes, event);
                }
            }
        });
        let (table, reference) = (self.0.clone(), image.to_string());
        tokio::spawn(async move {
            let result = runtime.pull_image(&reference, Some(tx)).await;
            // The outcome replaces the progress: later events have nothing to add.
            follow.abort();
            let Ok(mut table) = table.lock() else { return };
            match result {
                // Present now: the next attempt finds it in the store.
                Ok(_) => {
                    table.remove(&normalized);
                }
                Err(e) => {
                    // In the log too: an instance's reason is only seen by those who ask.
                    tracing::warn!(image = %reference, error = %e, "pull failed; retrying");
                    let error = format!("pulling {reference}: {e}");
                    table.insert(normalized, Pull::Failed(error));
                }
            }
        });
        status
    }
}

/// `status` in steps of a twentieth of the image (at least 1 MiB): what the instance's
/// status says, so that a pull changes it (and sends a heartbeat, and has the leader write
/// the workload's status) some twenty times, not once per MiB received.
fn coarse(status: &PullStatus) -> PullStatus {
    let step = (status.bytes_total / 20).max(1 << 20);
    let bytes_done = match status.bytes_done >= status.bytes_total {
        true => status.bytes_done,
        false => status.bytes_done / step * step,
    };
    PullStatus {
        bytes_done,
        ..status.clone()
    }
}

/// One progress event into the pull's status. Bytes count per layer (the runtime reports a
/// layer's running total), so a repeated report never counts twice.
fn fold(status: &mut PullStatus, layer_bytes: &mut HashMap<String, u64>, event: PullProgress) {
    match event {
        PullProgress::Resolved {
            layers,
            total_bytes,
            ..
        } => {
            status.layers = u32::try_from(layers).unwrap_or(u32::MAX);
            status.bytes_total = total_bytes;
        }
        PullProgress::LayerCached { size, .. } => {
            status.layers_done += 1;
            status.bytes_done += size;
        }
        PullProgress::LayerBytes {
            digest, downloaded, ..
        } => {
            let before = layer_bytes.insert(digest, downloaded).unwrap_or(0);
            status.bytes_done += downloaded.saturating_sub(before);
        }
        PullProgress::LayerDone { .. } => status.layers_done += 1,
        PullProgress::Done { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_layers_and_bytes_once() {
        let mut status = PullStatus {
            image: "web:1".into(),
            ..Default::default()
        };
        let mut seen = HashMap::new();
        let events = [
            PullProgress::Resolved {
                reference: "web:1".into(),
                layers: 3,
                total_bytes: 5 << 20,
            },
            PullProgress::LayerCached {
                digest: "sha256:a".into(),
                size: 1 << 20,
            },
            PullProgress::LayerBytes {
                digest: "sha256:b".into(),
                downloaded: 1 << 20,
                total: 2 << 20,
            },
            PullProgress::LayerBytes {
                digest: "sha256:b".into(),
                downloaded: 2 << 20,
                total: 2 << 20,
            },
            PullProgress::LayerDone {
                digest: "sha256:b".into(),
            },
            PullProgress::LayerBytes {
                digest: "sha256:c".into(),
                downloaded: 1 << 20,
                total: 2 << 20,
            },
        ];
        for e in events {
            fold(&mut status, &mut seen, e);
        }
        assert_eq!(
            (status.layers, status.layers_done, status.bytes_done),
            (3, 2, 4 << 20)
        );
        assert_eq!(
            status.summary(),
            "pulling web:1: 2 of 3 layers, 4.0 of 5.0 MiB"
        );
    }

    #[test]
    fn the_status_moves_in_twentieths() {
        let at = |done: u64| {
            coarse(&PullStatus {
                image: "big:1".into(),
                layers: 4,
                layers_done: 1,
                bytes_total: 200 << 20,
                bytes_done: done,
            })
            .bytes_done
        };
        assert_eq!(at(9 << 20), 0);
        assert_eq!(at(10 << 20), 10 << 20);
        assert_eq!(at(29 << 20), 20 << 20);
        assert_eq!(at(200 << 20), 200 << 20);
        let distinct: std::collections::BTreeSet<u64> =
            (0..=200u64).map(|mib| at(mib << 20)).collect();
        assert_eq!(distinct.len(), 21, "{distinct:?}");
    }
}
