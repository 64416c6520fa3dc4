//! Backups on demand (`katcall backup create`) and the list of them (`katcall get backups`).
//! The leader's schedule is `kat_leader::backups::run`; both write through
//! [`kat_leader::backups::take`].

use kat_api::wire::{BackupRecord, ErrorCode};
use kat_leader::backups::{self, BackupConfig};
use kat_store::EtcdStore;

use super::{Error, Result, Service};

/// A control-plane node's own etcd member and where its backups go.
#[derive(Clone)]
pub struct BackupTarget {
    pub etcd: EtcdStore,
    pub config: BackupConfig,
}

impl Service {
    /// A snapshot of this node's etcd member now, into its `backupPath`.
    pub async fn create_backup(&self) -> Result<BackupRecord> {
        let target = self.backups.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::Unavailable,
                "this node runs no etcd member, so it cannot take a backup: ask a control-plane node",
            )
        })?;
        backups::take(
            &target.etcd,
            &*self.store,
            &self.events,
            &target.config,
            "manual",
        )
        .await
        .map_err(|e| Error::new(ErrorCode::Internal, format!("backup failed: {e}")))
    }

    /// Every recorded backup, oldest first.
    pub async fn backups(&self) -> Result<Vec<BackupRecord>> {
        Ok(backups::list(&*self.store).await?)
    }
}
