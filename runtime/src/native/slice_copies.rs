//! The image copies that workloads' overlays read from: one per image and id slice, owned
//! by the slice's ids, made once and kept under `slots/SLOT/IMAGE`.
//!
//! Copying an image into a new slice is the longest step of a new workload's first create:
//! 30–50 ms for the 276 entries of the test busybox image on this machine's disk, with every
//! replica of the workload waiting for it. So when a workload is given a new slice, the
//! slice the next new workload will be given gets a copy of the same image, made at once on
//! a thread at the lowest priority (nice 19, one such thread at a time): the next new workload of that
//! image finds its copy ready. The spare copy takes no lock a create waits for: a create
//! that comes while it is under way makes its own copy at its own priority, and whichever
//! is renamed into place first is used. A guess that misses (the next workload runs another
//! image) leaves one image's files in that slice, which a workload of that image given it
//! later still uses; copies of images no longer in the store are removed with the image
//! ([`NativeRuntime::sweep_slice_copies`]), and half-made ones when the runtime starts.

use std::os::unix::fs::DirBuilderExt;

use super::*;

/// Everything copying an image into a slice needs, owned: it runs on blocking threads and on
/// the spare copy's own thread.
#[derive(Clone)]
pub(super) struct SliceCopier {
    /// `ROOT/slots`.
    slots: PathBuf,
    range: NodeIdRange,
    /// The agent's binary, which is also the id helper of an unprivileged agent.
    helper: PathBuf,
}

/// Ids as the image store keeps them: a root agent keeps the image's own ids (0…), an
/// unprivileged one owns every file itself.
fn stored_ids() -> ((u32, u32), u32) {
    if nix::unistd::geteuid().is_root() {
        ((0, 0), SLICE_SIZE)
    } else {
        (
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
            1,
        )
    }
}

/// What marks a copy under way (`IMAGE.partial-PID-NANOS`, see `make_checked`).
const PARTIAL: &str = ".partial-";

/// One copy at a time per slice and image for creates (the replicas of a new workload wait
/// for the one under way instead of making their own) and the sweep.
fn copy_lock(slot: u32, hex: &str) -> String {
    format!("slot-copy:{slot}:{hex}")
}

impl SliceCopier {
    /// Where slice `slot` keeps its copy of the image `hex`.
    pub(super) fn dest(&self, hex: &str, slot: u32) -> PathBuf {
        self.slots.join(slot.to_string()).join(hex)
    }

    /// Copies `from` to `to` (which must not exist) and shifts the copy into the slice whose
    /// root is `root`. Setuid and setgid bits do not survive the change of owner.
    pub(super) fn shifted_copy(&self, from: &Path, to: &Path, root: (u32, u32)) -> Result<()> {
        crate::image::snapshot::copy_tree(from, to, nix::unistd::geteuid().is_root())?;
        let (stored, count) = stored_ids();
        crate::id_tool::run(
            &self.helper,
            &self.range,
            &IdTask::Shift {
                path: to.to_path_buf(),
                from: stored,
                count,
                to: root,
            },
        )
    }

    /// [`Self::make`] for the spare: a copy of a snapshot that was removed (its image
    /// deleted) while it was read may be incomplete, and goes again.
    fn make_spare(&self, hex: &str, snapshot: &Path, slot: u32) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let identity = |p: &Path| fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let before = identity(snapshot);
        if before.is_none() || self.dest(hex, slot).is_dir() {
            return Ok(());
        }
        self.make_checked(hex, snapshot, slot, || identity(snapshot) == before)
            .map(drop)
    }

    /// Makes slice `slot`'s copy of `snapshot` (image `hex`) in a temporary directory and
    /// moves it into place, unless a copy got there first (then that one is kept).
    fn make(&self, hex: &str, snapshot: &Path, slot: u32) -> Result<PathBuf> {
        self.make_checked(hex, snapshot, slot, || true)
    }

    /// [`Self::make`], the copy moved into place only if `still_good` says so after it.
    fn make_checked(
        &self,
        hex: &str,
        snapshot: &Path,
        slot: u32,
        still_good: impl Fn() -> bool,
    ) -> Result<PathBuf> {
        let dest = self.dest(hex, slot);
        let slice_dir = self.slots.join(slot.to_string());
        // One directory per slice, which only that slice's root may pass through: other
        // local users (and other slices) cannot read the image copies below. Made with its
        // mode: never listable by others, not even for a moment.
        match fs::DirBuilder::new().mode(0o700).create(&slice_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).context(|| format!("creating {}", slice_dir.display()))
            }
            _ => {}
        }
        fs::set_permissions(&slice_dir, fs::Permissions::from_mode(0o700))
            .context(|| format!("chmod {}", slice_dir.display()))?;
        let slice_root = self.range.slot_root(slot);
        crate::acl::searchable_by(&slice_dir, &[slice_root.0])
            .context(|| format!("setting an ACL on {}", slice_dir.display()))?;
        // Named like the image store's temporary trees, made unique in this process too: a
        // create and the spare may copy for the same slice at once.
        let tmp = dest.with_extension(format!(
            "partial-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let made = self
            .shifted_copy(snapshot, &tmp, slice_root)
            .and_then(|()| {
                if still_good() {
                    Ok(())
                } else {
                    Err(RuntimeError::Container {
                        context: format!("copying {} into slice {slot}", snapshot.display()),
                        message: "the image was removed while it was copied".into(),
                    })
                }
            });
        let renamed = made.and_then(|()| {
            fs::rename(&tmp, &dest).or_else(|e| {
                if dest.is_dir() {
                    Ok(())
                } else {
                    Err(e).context(|| format!("moving {} into place", dest.display()))
                }
            })
        });
        if tmp.exists() {
            // Owned by the slice's ids: an unprivileged agent removes it through the helper.
            let _ = crate::id_tool::run(&self.helper, &self.range, &IdTask::Remove { path: tmp });
        }
        renamed.map(|()| dest)
    }

    /// Removes the half-made copies of an agent that stopped while copying (at the
    /// runtime's start, before any copy begins).
    pub(super) fn remove_partials(&self) {
        for (slot, name) in self
            .entries()
            .into_iter()
            .filter(|(_, n)| n.contains(PARTIAL))
        {
            let path = self.dest(&name, slot);
            if let Err(e) = crate::id_tool::run(
                &self.helper,
                &self.range,
                &IdTask::Remove { path: path.clone() },
            ) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a half-made image copy");
            }
        }
    }

    /// Every `(slot, name)` under `slots/`.
    fn entries(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        let Ok(slices) = fs::read_dir(&self.slots) else {
            return found;
        };
        for slice in slices.flatten() {
            let Ok(slot) = slice.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(entries) = fs::read_dir(slice.path()) else {
                continue;
            };
            found.extend(
                entries
                    .flatten()
                    .map(|e| (slot, e.file_name().to_string_lossy().into_owned())),
            );
        }
        found
    }
}

/// Lowers the calling thread, and the helpers it starts, to nice 19: about 1.5 % of a core
/// that anything else wants, which needs no privilege. (`SCHED_IDLE`, 0.3 %, left a node
/// under steady load without its spare for tens of seconds.)
fn low_priority() {
    // SAFETY: system calls about the calling thread only.
    let tid = unsafe { libc::gettid() };
    // SAFETY: as above; a thread id is a valid `who` for PRIO_PROCESS on Linux.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the spare copy's priority");
    }
}

impl NativeRuntime {
    pub(super) fn slice_copier(&self) -> Result<SliceCopier> {
        Ok(SliceCopier {
            slots: self.config.root.join("slots"),
            range: self.id_range()?,
            helper: self.config.create_helper.clone(),
        })
    }

    /// Copies `from` to `to` (which must not exist), shifted into the slice whose root is
    /// `root`: a container's own root file system where overlays are not available.
    pub(super) async fn shifted_copy(
        &self,
        from: &Path,
        to: &Path,
        root: (u32, u32),
    ) -> Result<()> {
        let copier = self.slice_copier()?;
        let (f, t) = (from.to_path_buf(), to.to_path_buf());
        blocking("copying the image", move || {
            copier.shifted_copy(&f, &t, root)
        })
        .await
    }

    /// The image's tree owned by slice `slot`: the lower directory of its containers'
    /// overlays, made once per image and slice.
    pub(super) async fn slot_rootfs(
        &self,
        image_id: &str,
        snapshot: &Path,
        slot: u32,
    ) -> Result<PathBuf> {
        let copier = self.slice_copier()?;
        let hex = image_id.trim_start_matches("sha256:").to_string();
        let dest = copier.dest(&hex, slot);
        if dest.is_dir() {
            return Ok(dest);
        }
        let lock = self.images.locks.get(&copy_lock(slot, &hex));
        let one_copy = lock.lock().await;
        if dest.is_dir() {
            // Made while this create waited: by another replica, or as the spare.
            return Ok(dest);
        }
        let (c, h, s) = (copier.clone(), hex.clone(), snapshot.to_path_buf());
        let dest = blocking(
            "copying the image into the workload's id slice",
            move || c.make(&h, &s, slot),
        )
        .await?;
        drop(one_copy);
        Ok(dest)
    }

    /// [`Self::sweep_slice_copies`] after images were removed: a failure is logged, the
    /// removal itself stands.
    pub(super) async fn sweep_after_removal(&self) {
        if let Err(e) = self.sweep_slice_copies().await {
            tracing::warn!(error = %e, "cannot remove the id slices' copies of removed images (the next removal or prune tries again)");
        }
    }

    /// Removes every slice's copy of an image the store no longer has, after an image is
    /// removed or pruned (a removed image is in no container's use, see `images_in_use`).
    /// Skipped while a create is under way (its copy may not be in use yet); the next
    /// removal or prune does it.
    pub(super) async fn sweep_slice_copies(&self) -> Result<()> {
        let Ok(copier) = self.slice_copier() else {
            return Ok(());
        };
        if !self
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            return Ok(());
        }
        let stored = || -> Result<HashSet<String>> {
            Ok(self
                .images
                .list()?
                .into_iter()
                .map(|i| i.id.trim_start_matches("sha256:").to_string())
                .collect())
        };
        let listing = copier.clone();
        let entries = blocking("listing the slices' image copies", move || {
            Ok(listing.entries())
        })
        .await?;
        let kept = stored()?;
        let mut removed = 0;
        for (slot, name) in entries {
            // Half-made copies belong to a copy under way (those of a stopped agent went at
            // start).
            if name.contains(PARTIAL) || kept.contains(&name) {
                continue;
            }
            let lock = self.images.locks.get(&copy_lock(slot, &name));
            let _one_copy = lock.lock().await;
            // Pulled again meanwhile: its copy may be in use already.
            if stored()?.contains(&name) {
                continue;
            }
            self.id_task(IdTask::Remove {
                path: copier.dest(&name, slot),
            })
            .await?;
            removed += 1;
        }
        if removed > 0 {
            tracing::info!(
                removed,
                "removed the id slices' copies of images no longer stored"
            );
        }
        Ok(())
    }

    /// After a workload was given a new slice: starts making the copy of the image for the
    /// slice a new workload would be given now, if one is free and has none and no spare
    /// copy is under way (see the module's documentation).
    pub(super) fn prepare_spare(&self, image_id: &str, snapshot: &Path) {
        let Ok(copier) = self.slice_copier() else {
            return;
        };
        let hex = image_id.trim_start_matches("sha256:").to_string();
        let next = match self.slices.lock() {
            Ok(table) => table.as_ref().and_then(IdSlices::next_free),
            Err(_) => None,
        };
        let Some(slot) = next else {
            return;
        };
        if copier.dest(&hex, slot).is_dir() || self.spare_under_way.swap(true, Ordering::AcqRel) {
            return;
        }
        let snapshot = snapshot.to_path_buf();
        let under_way = self.spare_under_way.clone();
        let spawned = std::thread::Builder::new()
            .name("kat-spare-copy".into())
            .spawn(move || {
                low_priority();
                match copier.make_spare(&hex, &snapshot, slot) {
                    Ok(()) => tracing::debug!(slot, "spare image copy ready for the next new workload"),
                    Err(e) => tracing::warn!(slot, error = %e, "cannot make a spare image copy for the next new workload (it will copy the image itself)"),
                }
                under_way.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            self.spare_under_way.store(false, Ordering::Release);
            tracing::warn!(error = %e, "cannot start the spare image copy's thread");
        }
    }
}
