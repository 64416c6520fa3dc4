//! Making a container: limits checked, volumes opened and verified, an id slot and its
//! shifted root file system, the network joined; and forgetting a half-made one.

use std::time::Instant;

use super::*;

impl NativeRuntime {
    /// The node's id range, or the error every create gives when it has none.
    pub(super) fn id_range(&self) -> Result<NodeIdRange> {
        self.range
            .as_ref()
            .copied()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })
    }

    /// Checks limits against what is possible; returns warnings for what cannot be enforced.
    pub(super) fn check_limits(&self, r: &Resources) -> Result<Vec<String>> {
        if r.memory_limit_bytes > 0 && r.memory_limit_bytes < 4 * 1024 * 1024 {
            return Err(RuntimeError::BadLimits(format!(
                "memory limit {} bytes is below the 4 MiB a container needs to start",
                r.memory_limit_bytes
            )));
        }
        if r.cpu_limit_millis > 0 && r.cpu_limit_millis < 10 {
            return Err(RuntimeError::BadLimits(format!(
                "cpu limit {}m is below the kernel's minimum of 10m (1 ms per 100 ms)",
                r.cpu_limit_millis
            )));
        }
        if r.cpu_limit_millis > 0 && r.cpu_request_millis > r.cpu_limit_millis {
            return Err(RuntimeError::BadLimits(format!(
                "cpu request {}m is above the cpu limit {}m",
                r.cpu_request_millis, r.cpu_limit_millis
            )));
        }
        if r.pids_limit > 0 && r.pids_limit < 2 {
            return Err(RuntimeError::BadLimits(
                "pids limit must be at least 2 (kat-init and the workload)".into(),
            ));
        }
        let mut warnings = Vec::new();
        let mode = format!("{:?}", self.caps.cgroup_mode);
        if r.memory_limit_bytes > 0 && !self.caps.memory_limit {
            warnings.push(format!(
                "memory limit not enforced on this node (cgroups: {mode})"
            ));
        }
        if (r.cpu_limit_millis > 0 || r.cpu_request_millis > 0) && !self.caps.cpu_limit {
            warnings.push(format!(
                "cpu limit not enforced on this node (cgroups: {mode})"
            ));
        }
        if r.pids_limit > 0 && !self.caps.pids_limit {
            warnings.push(format!(
                "pids limit not enforced on this node (cgroups: {mode})"
            ));
        }
        Ok(warnings)
    }

    /// Opens every volume's source (its `subPath` walked without following symlinks, see
    /// [`crate::volume_paths`]); the opened sources are checked again once mounted.
    pub(super) fn volume_sources(&self, options: &CreateOptions) -> Result<Vec<OpenedSource>> {
        let mut out = Vec::new();
        for v in &options.volumes {
            let bad = |reason: &str| RuntimeError::BadMount {
                name: v.name.clone(),
                source_path: v.source.clone(),
                reason: reason.to_string(),
            };
            if !v.source.is_absolute() {
                return Err(bad("is not an absolute path"));
            }
            if !v.destination.starts_with('/') || v.destination.split('/').any(|c| c == "..") {
                return Err(bad(&format!(
                    "has destination {:?}, which must be an absolute path without '..'",
                    v.destination
                )));
            }
            spec::check_destination(&v.destination, &format!("volume {} destination", v.name))?;
            if let Some(sub) = &v.sub_path {
                if sub.starts_with('/') || sub.split('/').any(|c| c == "..") {
                    return Err(bad(&format!(
                        "subPath {sub:?} must be relative and without '..'"
                    )));
                }
            }
            // The source was resolved by the agent: it is opened refusing any symlink, and
            // so is everything below it, which a container may have planted.
            let opened = crate::volume_paths::open_beneath(&v.source, v.sub_path.as_deref(), true)
                .map_err(|e| match &v.sub_path {
                    Some(sub) => bad(&format!("subPath {sub:?}: {e}")),
                    None => bad(&e),
                })?;
            out.push(opened);
        }
        Ok(out)
    }

    /// After create, before start: every volume mount is the object opened for it.
    pub(super) fn verify_volumes(
        &self,
        options: &CreateOptions,
        pid: i32,
        sources: &[OpenedSource],
    ) -> Result<()> {
        crate::volume_paths::verify_reserved_dir(pid).map_err(|message| {
            RuntimeError::Container {
                context: format!("creating {}", options.id),
                message,
            }
        })?;
        for (v, source) in options.volumes.iter().zip(sources) {
            crate::volume_paths::verify_mounted(pid, &v.destination, source).map_err(|reason| {
                RuntimeError::BadMount {
                    name: v.name.clone(),
                    source_path: v.source.clone(),
                    reason,
                }
            })?;
        }
        Ok(())
    }

    /// Everything of `create` after the container directory exists; on error the caller
    /// removes that directory.
    pub(super) async fn create_in(&self, options: &CreateOptions, dir: &Path) -> Result<Meta> {
        let mut phases = crate::phases::Phases::begin("create");
        let warnings = self.check_limits(&options.resources)?;
        let record = self.images.resolve(&options.image)?;
        let volume_sources = self.volume_sources(options)?;
        let snapshot = self.images.snapshot(&record).await?;
        let user = if options.user.is_empty() {
            record.config.user.clone()
        } else {
            options.user.clone()
        };
        let (uid, gid) = crate::rootfs::resolve_user(&snapshot, &user)?;
        let argv = spec::workload_argv(&record.config, &options.command, &options.args);
        if argv.is_empty() {
            return Err(RuntimeError::InvalidOption {
                field: "command".into(),
                reason: format!(
                    "image {} has no Entrypoint or Cmd; give the workload a command",
                    options.image
                ),
            });
        }
        let hostname = if options.hostname.is_empty() {
            options.id.clone()
        } else {
            options.hostname.clone()
        };
        let env = spec::merged_env(&record.config, &options.env, &hostname);
        let image_root = crate::tree_dir::TreeDir::open(&snapshot)
            .context(|| format!("opening {}", snapshot.display()))?;
        crate::rootfs::find_executable(&image_root, &argv[0], &env)?;
        let destinations: Vec<(&str, &str)> = options
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v.destination.as_str()))
            .collect();
        crate::rootfs::check_reserved_paths(&image_root, &destinations)?;
        let cwd = if record.config.working_dir.is_empty() {
            "/".to_string()
        } else {
            record.config.working_dir.clone()
        };

        phases.mark("image");
        let range = self.id_range()?;
        let Acquired {
            slot,
            new: new_slice,
        } = self.acquire_slot(options)?;
        let ids = range.slot_map(slot, !nix::unistd::geteuid().is_root());
        let host_root = range.slot_root(slot);
        let host_user = (ids.host_uid(uid), ids.host_gid(gid));
        // Its root only: the workload reaches its files through the mounts root made.
        crate::acl::searchable_by(dir, &[host_root.0]).context(|| {
            format!(
                "setting an ACL on {} (the file system must support POSIX ACLs)",
                dir.display()
            )
        })?;
        phases.mark("slot");
        let logs = dir.join("logs");
        let etc = dir.join("etc");
        let rootfs = dir.join("rootfs");
        let kat_dir = dir.join("kat");
        for d in [&logs, &etc, &dir.join("bundle")] {
            fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
        }
        spec::make_kat_dir(&kat_dir).context(|| format!("creating {}", kat_dir.display()))?;
        // config.json holds the workload's environment (secrets, often): ours alone.
        fs::set_permissions(dir.join("bundle"), fs::Permissions::from_mode(0o700))
            .context(|| "chmod bundle".to_string())?;
        // kat-init writes here as the workload's user, and only it and we may: ours, with
        // an ACL for it (see `acl`); no other host user gets in.
        fs::set_permissions(&logs, fs::Permissions::from_mode(0o700))
            .context(|| format!("chmod {}", logs.display()))?;
        crate::acl::share_log_dir(&logs, host_user.0, nix::unistd::geteuid().as_raw()).context(
            || {
                format!(
                    "setting an ACL on {} (the file system must support POSIX ACLs)",
                    logs.display()
                )
            },
        )?;
        fs::write(
            etc.join("hosts"),
            spec::hosts_file(&hostname, options.address, &options.hosts),
        )
        .context(|| "writing /etc/hosts".to_string())?;
        fs::write(etc.join("hostname"), format!("{hostname}\n"))
            .context(|| "writing /etc/hostname".to_string())?;
        fs::write(
            etc.join("resolv.conf"),
            spec::resolv_conf(&options.dns_servers, &options.dns_search),
        )
        .context(|| "writing /etc/resolv.conf".to_string())?;

        phases.mark("files");
        let use_overlay = self.overlay.load(Ordering::Relaxed);
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        // The root file system and the network are independent: each waits on its own
        // helper processes and the kernel, so they are made side by side (an apply on a
        // busy node spent 10-30 ms on each, one after the other).
        // The workload's root owns the overlay's directories and its own volumes.
        let mut owned: Vec<PathBuf> = if use_overlay {
            vec![rootfs.clone(), upper.clone(), work.clone()]
        } else {
            Vec::new()
        };
        owned.extend(
            options
                .volumes
                .iter()
                .filter(|v| v.owned_by_container)
                .map(|v| v.source.clone()),
        );
        // An unprivileged agent's create helper enters the node user namespace, which maps
        // the node's ids, when the container joins the node network: it gives these to the
        // workload's root there, and the create needs no id helper (an exec and two of
        // newuidmap/newgidmap: 25-30 ms of a busy node's create).
        let owned_by_create_helper = options.address.is_some() && !nix::unistd::geteuid().is_root();
        let rootfs_work = async {
            let began = Instant::now();
            let plan = RootfsPlan {
                image_id: &record.id,
                snapshot: &snapshot,
                slot,
                new_slice,
                owner: host_root,
                owned: &owned,
                owned_by_create_helper,
                overlay: use_overlay,
                mountpoint: &rootfs,
                upper: &upper,
                work: &work,
            };
            let lower = self.prepare_rootfs(plan).await;
            (lower, began.elapsed())
        };
        let network_work = async {
            let began = Instant::now();
            let joined = match options.address {
                Some(address) => self.join_network(address, &ids).await.map(Some),
                None => Ok(None),
            };
            (joined, began.elapsed())
        };
        let ((lower, rootfs_took), (joined, network_took)) =
            tokio::join!(rootfs_work, network_work);
        // On an error, the other half's work is undone as the caller removes the container
        // directory and `joined` is let go.
        let joined = joined.map(HeldNamespaces);
        let (lower, mut parts) = lower?;
        let joined = joined?;
        parts.extend([("rootfs", rootfs_took), ("network", network_took)]);
        phases.mark_side_by_side(&parts, "rootfs_network");
        let cgroups_path = self.cgroups.container_path(&options.id);
        let kat_limits = self.cgroups.kat_applies_limits();
        let input = SpecInput {
            options,
            hostname: &hostname,
            argv,
            env,
            cwd,
            uid,
            gid,
            ids: &ids,
            rootfs: if use_overlay {
                Rootfs::Overlay {
                    mountpoint: &rootfs,
                    lower: &lower,
                    upper: &upper,
                    work: &work,
                }
            } else {
                Rootfs::Copy(&rootfs)
            },
            init_binary: &self.config.init_binary,
            kat_dir: &kat_dir,
            etc_dir: &etc,
            log_dir: &logs,
            volume_sources: volume_sources.iter().map(|o| o.path.clone()).collect(),
            cgroups_path,
            memory_limit: self.caps.memory_limit && !kat_limits,
            cpu_limit: self.caps.cpu_limit && !kat_limits,
            pids_limit: self.caps.pids_limit && !kat_limits,
            omit_resources: kat_limits,
            seccomp: self.config.seccomp,
            cgroup_mount: matches!(
                self.cgroups.mode,
                CgroupMode::Systemd | CgroupMode::V2Delegated | CgroupMode::V2Root
            ),
            joined: joined.0.as_ref().map(|j| (j.user(), j.network())),
        };
        let config = spec::build(&input).map_err(|e| lc_error("building config.json", e))?;
        let bundle = dir.join("bundle");
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).map_err(|e| lc_error("encoding config.json", e))?,
        )
        .context(|| "writing config.json".to_string())?;

        phases.mark("spec");
        let request = crate::create_helper::Request {
            id: options.id.clone(),
            lib_root: self.lib_root(),
            bundle,
            systemd: self.cgroups.mode == CgroupMode::Systemd,
            enter_user_namespace: joined
                .0
                .as_ref()
                .filter(|_| !nix::unistd::geteuid().is_root())
                .map(|j| j.parent_user()),
            own_first: owned_by_create_helper.then(|| crate::create_helper::OwnFirst {
                paths: owned.clone(),
                host_uid: host_root.0,
                host_gid: host_root.1,
            }),
            // Set as the helper is spawned.
            spawned_at_micros: 0,
        };
        let helper =
            crate::create_helper::create(&self.helpers, request, &dir.join("create.err")).await?;
        match helper {
            Some(times) => phases.mark_parts(
                &[("helper_start", times.start), ("helper_build", times.build)],
                "helper_exit",
            ),
            None => phases.mark("helper"),
        }
        // The container's processes hold its namespaces now: the attach helper may go.
        drop(joined);
        // kat-init is our child now (its helper is gone and we are a subreaper): wait for it.
        let init_pid = self.load_container(&options.id).and_then(|c| c.pid());
        if let Some(pid) = init_pid {
            let (cgroups, id) = (self.cgroups.clone(), options.id.clone());
            let reaping = self.reaping.clone();
            reaping.started(&options.id);
            let done_id = options.id.clone();
            spawn_reaper(
                pid.as_raw(),
                logs,
                move || cgroups.oom_killed(&id),
                move || reaping.done(&done_id),
            );
        }
        if let Some(pid) = init_pid {
            self.verify_volumes(options, pid.as_raw(), &volume_sources)?;
        }
        phases.mark("verify");
        if kat_limits {
            self.cgroups
                .apply_v1_limits(&options.id, &options.resources)?;
        }

        phases.mark("limits");
        phases.report(&options.id);
        Ok(Meta {
            options: options.clone(),
            image_id: record.id,
            created_at: SystemTime::now(),
            started_at: None,
            rootfs: if use_overlay {
                RootfsMode::Overlay
            } else {
                RootfsMode::Copy
            },
            warnings,
        })
    }

    /// The container's root file system as `plan` says: with the overlay, its directories
    /// and the image's copy in the slice (returned: the overlay's lower layer); without, a
    /// shifted copy at the mount point (returned). `plan.owned` goes to the workload's root
    /// here unless the create helper does it.
    ///
    /// Also returns how long its parts took, for the phases.
    async fn prepare_rootfs(
        &self,
        plan: RootfsPlan<'_>,
    ) -> Result<(PathBuf, Vec<(&'static str, Duration)>)> {
        let give = |paths: Vec<PathBuf>| async move {
            let began = Instant::now();
            if !paths.is_empty() && !plan.owned_by_create_helper {
                self.id_task(IdTask::Own {
                    paths,
                    owner: plan.owner,
                })
                .await?;
            }
            Ok::<_, RuntimeError>(began.elapsed())
        };
        if !plan.overlay {
            self.shifted_copy(plan.snapshot, plan.mountpoint, plan.owner)
                .await?;
            give(plan.owned.to_vec()).await?;
            return Ok((plan.mountpoint.to_path_buf(), Vec::new()));
        }
        for d in [plan.mountpoint, plan.upper, plan.work] {
            fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
        }
        fs::set_permissions(plan.upper, fs::Permissions::from_mode(0o755))
            .context(|| format!("chmod {}", plan.upper.display()))?;
        // The ownership (a helper process for an unprivileged agent, unless the create
        // helper does it) and the slice's copy of the image (ready if it was made ahead)
        // are independent too.
        let copying = async {
            let began = Instant::now();
            self.slot_rootfs(plan.image_id, plan.snapshot, plan.slot)
                .await
                .map(|lower| (lower, began.elapsed()))
        };
        let (owned, copied) = tokio::join!(give(plan.owned.to_vec()), copying);
        let ((lower, copy_took), own_took) = (copied?, owned?);
        if plan.new_slice {
            self.prepare_spare(plan.image_id, plan.snapshot);
        }
        Ok((
            lower,
            vec![("rootfs_owner", own_took), ("rootfs_copy", copy_took)],
        ))
    }

    /// The namespaces a container with `address` joins, from the node network.
    pub(super) async fn join_network(
        &self,
        address: std::net::Ipv4Addr,
        ids: &IdMap,
    ) -> Result<Box<dyn crate::network::JoinedNamespaces>> {
        let network = self
            .config
            .network
            .clone()
            .ok_or_else(|| RuntimeError::InvalidOption {
                field: "address".into(),
                reason: format!("this node has no container network to give {address} on"),
            })?;
        let ids = ids.clone();
        blocking("connecting the container to the node network", move || {
            network
                .prepare(address, &ids)
                .map_err(|message| RuntimeError::Container {
                    context: format!("connecting the container to the node network as {address}"),
                    message,
                })
        })
        .await
    }

    /// Runs an ownership task off the async threads (see [`crate::id_tool`]).
    pub(super) async fn id_task(&self, task: IdTask) -> Result<()> {
        let range = self.id_range()?;
        let program = self.config.create_helper.clone();
        blocking("changing file ownership", move || {
            crate::id_tool::run(&program, &range, &task)
        })
        .await
    }

    /// The slice of this container's workload, allocated on first use and kept.
    pub(super) fn acquire_slot(&self, options: &CreateOptions) -> Result<Acquired> {
        let range = self.id_range()?;
        let key = WorkloadKey::new(&options.namespace, &options.workload);
        let mut guard = self
            .slices
            .lock()
            .map_err(|_| lc_error("the id-slice table", "a thread panicked while holding it"))?;
        if guard.is_none() {
            *guard = Some(IdSlices::load(
                &self.config.root.join("id-slices.json"),
                // The last slice is the builds' (`builder`), the one before it the layer
                // unpacker's when the range has room for it.
                range
                    .slots()
                    .saturating_sub(if UnpackSandbox::slot(&range).is_some() {
                        2
                    } else {
                        1
                    })
                    .max(1),
            )?);
        }
        let table = guard
            .as_mut()
            .ok_or_else(|| lc_error("the id-slice table", "not loaded"))?;
        // In use: a workload with containers here, or with a create under way (its
        // container has no meta.json yet).
        let in_use = std::cell::OnceCell::new();
        table.acquire(&key, |k| {
            in_use
                .get_or_init(|| {
                    let mut keys = self.workloads_with_containers();
                    keys.extend(
                        self.creating
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .iter()
                            .cloned(),
                    );
                    keys
                })
                .contains(k)
        })
    }

    /// The workload of every container on the node.
    pub(super) fn workloads_with_containers(&self) -> HashSet<WorkloadKey> {
        let dir = self.config.root.join("containers");
        fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| self.read_meta(&e.file_name().to_string_lossy()).ok())
            .map(|m| WorkloadKey::new(&m.options.namespace, &m.options.workload))
            .collect()
    }

    /// Forgets a half-made container: libcontainer state, cgroups, files.
    pub(super) fn discard(&self, id: &str) {
        if let Some(mut c) = self.load_container(id) {
            let _ = c.kill(LcSignal::try_from(9).expect("SIGKILL is a signal"), true);
            let _ = c.delete(true);
        }
        let _ = remove_tree(&self.lib_root().join(id));
        // The upper layer and logs belong to the workload's ids: an unprivileged agent
        // removes them from inside a user namespace.
        if remove_tree(&self.dir(id)).is_err() {
            if let Ok(range) = &self.range {
                let task = IdTask::Remove { path: self.dir(id) };
                if let Err(e) = crate::id_tool::run(&self.config.create_helper, range, &task) {
                    tracing::warn!(container = %id, error = %e, "cannot remove the container's files");
                }
            }
        }
        self.cgroups.remove(id);
    }
}

/// What a container's root file system is made from, and where (see
/// [`NativeRuntime::prepare_rootfs`]).
struct RootfsPlan<'a> {
    image_id: &'a str,
    snapshot: &'a Path,
    /// The workload's id slot, and whether it was just given to the workload.
    slot: u32,
    new_slice: bool,
    /// The workload's root, as host ids, and what it owns.
    owner: (u32, u32),
    owned: &'a [PathBuf],
    /// The create helper gives `owned` to `owner` (see `create_in`), not this step.
    owned_by_create_helper: bool,
    /// An overlay over the slice's copy of the image, or a copy of the image of its own.
    overlay: bool,
    /// The overlay's mount point, or where the copy goes.
    mountpoint: &'a Path,
    upper: &'a Path,
    work: &'a Path,
}

/// A container's namespaces from the node network while its create needs them. Letting
/// them go waits for the attach helper to exit, so it happens on a blocking thread, however
/// the create ends.
struct HeldNamespaces(Option<Box<dyn crate::network::JoinedNamespaces>>);

impl Drop for HeldNamespaces {
    fn drop(&mut self) {
        if let Some(joined) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(move || drop(joined));
                }
                Err(_) => drop(joined),
            }
        }
    }
}
