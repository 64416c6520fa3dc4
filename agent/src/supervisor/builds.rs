//! Images of `source.git` workloads, built on this node: one build per image reference at a
//! time, whichever replicas wait for it, beside convergence (a long build never delays
//! another instance's restart, stop or probe). The image is kept as
//! `kat-local/{namespace}_{workload}:{sha7}` and reused while the commit is the same, so a
//! rollback to an earlier commit that was built here does not build again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kat_api::workload::GitSource;
use kat_api::Template;
use kat_runtime::build::{local_reference, BuildLimits, BuildPhase, BuildRequest};
use kat_runtime::ContainerRuntime;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StartError;

/// A failed build is not tried again for this long: every instance waiting for it fails
/// with its reason meanwhile (a broken Dockerfile does not rebuild in a loop).
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

enum Entry {
    Running(watch::Receiver<BuildPhase>),
    Failed { reason: String, at: Instant },
}

#[derive(Clone, Default)]
pub(super) struct Builds {
    table: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Builds {
    /// The reference of the instance's image once it is in the store; until then, why not
    /// (building, with progress) or why it failed.
    pub(super) async fn ensure(
        &self,
        runtime: &Arc<dyn ContainerRuntime>,
        template: &Template,
        git: &GitSource,
    ) -> Result<String, StartError> {
        let meta = &template.workload.metadata;
        let commit = git.commit.clone().ok_or_else(|| {
            StartError::Failed(
                "source.git has no commit recorded for this generation; apply the workload again"
                    .into(),
            )
        })?;
        let reference = local_reference(&meta.namespace, &meta.name, &commit);
        let short: String = commit.chars().take(7).collect();
        let normalized = kat_runtime::image::normalize_reference(&reference)
            .map_err(|e| StartError::Failed(format!("the build's image name: {e}")))?;
        if let Ok(list) = runtime.list_images().await {
            if list.iter().any(|i| i.references.contains(&normalized)) {
                return Ok(reference);
            }
        }
        let mut table = self
            .table
            .lock()
            .map_err(|_| StartError::NotReady("the build table is poisoned".into()))?;
        match table.get(&normalized) {
            Some(Entry::Running(phase)) => {
                return Err(StartError::NotReady(format!(
                    "building {short} from {}: {}",
                    git.repository,
                    *phase.borrow()
                )))
            }
            Some(Entry::Failed { reason, at }) if at.elapsed() < RETRY_FAILED_AFTER => {
                return Err(StartError::Failed(reason.clone()));
            }
            _ => {}
        }
        let build = template.build.as_ref().map(|b| &b.spec);
        let request = BuildRequest {
            repository: git.repository.clone(),
            commit: commit.clone(),
            context: build.map_or(".".into(), |b| b.build_context.clone()),
            dockerfile: build.map_or("Dockerfile".into(), |b| b.dockerfile_path.clone()),
            build_args: build.map(|b| b.build_args.clone()).unwrap_or_default(),
            target: build.and_then(|b| b.target_stage.clone()),
            platform: build.and_then(|b| b.platform.clone()),
            reference: reference.clone(),
            log_file: None,
        };
        let (tx, rx) = watch::channel(BuildPhase::Cloning);
        table.insert(normalized.clone(), Entry::Running(rx));
        drop(table);
        tracing::info!(image = %reference, repository = %git.repository, "building");
        let (runtime, table, label) = (runtime.clone(), self.table.clone(), short.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let result = runtime
                .build_image(&request, BuildLimits::default(), &tx)
                .await;
            let Ok(mut table) = table.lock() else { return };
            match result {
                Ok(_) => {
                    tracing::info!(image = %request.reference, seconds = started.elapsed().as_secs_f64(), "built");
                    table.remove(&normalized);
                }
                Err(e) => {
                    let reason = format!("building {label}: {e}");
                    tracing::warn!(image = %request.reference, %reason, "build failed");
                    table.insert(
                        normalized,
                        Entry::Failed {
                            reason,
                            at: Instant::now(),
                        },
                    );
                }
            }
        });
        Err(StartError::NotReady(format!(
            "building {short} from {}: cloning",
            git.repository
        )))
    }
}
