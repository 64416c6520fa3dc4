//! KAT's default seccomp filter, installed by kat-init in itself before it starts the
//! workload, so the workload and everything `katcall exec` runs (also through kat-init)
//! inherit it, and a workload that ptraces PID 1 finds it filtered too.
//!
//! It is a deny list in the spirit of Docker's default profile, written as a classic BPF
//! program here rather than through libseccomp, so kat-init stays static and the filter is
//! the same on every node:
//!
//! - syscalls that reach the host kernel's global state or widen the attack surface
//!   (modules, kexec, keyrings, bpf, perf, mounts, namespaces, clocks, swap, reboot,
//!   io_uring, userfaultfd, handle-based opens, another process's fds or memory through
//!   `pidfd_getfd`, `process_vm_readv`/`writev`, `process_madvise` and `kcmp`, …) fail with
//!   `EPERM`;
//! - `clone` with any namespace flag fails with `EPERM`, and `clone3` with `ENOSYS` (its
//!   flags are out of a filter's reach; libc falls back to `clone`);
//! - `personality` is allowed only for the values Docker allows;
//! - a syscall of another ABI (i386 or x32 on x86_64) kills the process.
//!
//! Everything else is allowed, so new syscalls and unusual programs keep working.
//!
//! Why not `seccompiler`: it compiles allow-list rule maps into BPF; a deny list whose default
//! is allow, with a kill for foreign ABIs and an `ENOSYS` for `clone3`, fits it poorly, and
//! the program here is ~60 instructions that the table test in this file checks case by case
//! (syscall, argument, verdict) through a BPF interpreter.

use nix::libc;

/// Why the filter could not be installed.
pub type Error = String;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Namespace flags of clone(2): CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
/// NEWPID, NEWNET.
const CLONE_NAMESPACES: u32 = 0x0000_0080
    | 0x0002_0000
    | 0x0200_0000
    | 0x0400_0000
    | 0x0800_0000
    | 0x1000_0000
    | 0x2000_0000
    | 0x4000_0000;

/// `personality` values Docker allows: PER_LINUX, PER_LINUX32, UNAME26 and each with
/// PER_LINUX32, and the query 0xffffffff.
const PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Denied everywhere.
const DENIED: &[libc::c_long] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_get_mempolicy,
    libc::SYS_init_module,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_io_uring_setup,
    libc::SYS_kcmp,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mbind,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_move_pages,
    libc::SYS_name_to_handle_at,
    libc::SYS_nfsservctl,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pidfd_getfd,
    libc::SYS_pivot_root,
    libc::SYS_process_madvise,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_set_mempolicy,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_userfaultfd,
];

/// Denied, and only present on x86_64.
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[libc::c_long] = &[
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS__sysctl,
    libc::SYS_sysfs,
    libc::SYS_uselib,
    libc::SYS_ustat,
];
#[cfg(target_arch = "aarch64")]
const DENIED_ARCH: &[libc::c_long] = &[];

/// Offsets in `struct seccomp_data`: nr, arch, then the six u64 args from 16 (the low
/// half of each first, on these little-endian targets).
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARG0_LOW: u32 = 16;

// Classic BPF opcodes.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
}

/// The filter program. Every test jumps at most a couple of instructions, so the program
/// never needs the 8-bit jump offsets to reach far.
pub fn program() -> Vec<libc::sock_filter> {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        // x32 syscalls carry bit 30 in the number.
        p.push(jump(BPF_JGE_K, 0x4000_0000, 0, 1));
        p.push(stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS));
    }
    for nr in DENIED.iter().chain(DENIED_ARCH) {
        p.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        p.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    }
    p.push(jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1));
    p.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    // clone: the flags are the first argument on x86_64 and aarch64.
    p.push(jump(BPF_JEQ_K, libc::SYS_clone as u32, 0, 4));
    p.push(stmt(BPF_LD_W_ABS, OFFSET_ARG0_LOW));
    p.push(jump(BPF_JSET_K, CLONE_NAMESPACES, 0, 1));
    p.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    p.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    // personality: the allowed values only.
    let n = PERSONALITIES.len() as u8;
    p.push(jump(BPF_JEQ_K, libc::SYS_personality as u32, 0, 2 + n));
    p.push(stmt(BPF_LD_W_ABS, OFFSET_ARG0_LOW));
    for (i, value) in PERSONALITIES.iter().enumerate() {
        // Match: jump to the ALLOW after the EPERM return.
        p.push(jump(BPF_JEQ_K, *value, n - i as u8, 0));
    }
    p.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    p.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    p
}

/// Installs the filter in this (single-threaded) process; it is inherited across fork and
/// exec. Sets `no_new_privs` first, which the kernel requires of an unprivileged caller.
pub fn install() -> Result<(), Error> {
    let filter = program();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    // SAFETY: prctl with its documented arguments; `prog` points at `filter`, alive for the
    // call (the kernel copies the program).
    unsafe {
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        ) != 0
        {
            return Err(format!(
                "cannot install the seccomp filter: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on one `seccomp_data`, as the kernel would.
    fn run(program: &[libc::sock_filter], nr: u32, arch: u32, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        data[16..24].copy_from_slice(&arg0.to_le_bytes());
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = program[pc];
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_RET_K => return i.k,
                BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K => {
                    let taken = match i.code {
                        BPF_JEQ_K => acc == i.k,
                        BPF_JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += 1 + if taken { i.jt } else { i.jf } as usize;
                }
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn denies_allows_and_checks_arguments() {
        let p = program();
        assert!(
            p.len() < 4096,
            "BPF programs are limited to 4096 instructions"
        );
        let (allow, eperm) = (SECCOMP_RET_ALLOW, errno(libc::EPERM));
        let sigchld = libc::SIGCHLD as u64;
        let threads = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        // (syscall, first argument, verdict)
        let mut cases = vec![
            (libc::SYS_read, 0, allow),
            (libc::SYS_write, 0, allow),
            (libc::SYS_clone3, 0, errno(libc::ENOSYS)),
            // fork-like clone and threads are fine; new namespaces are not.
            (libc::SYS_clone, sigchld, allow),
            (libc::SYS_clone, threads, allow),
            (libc::SYS_personality, 0xffff_ffff, allow),
            (libc::SYS_personality, 0x8, allow),
            // ADDR_NO_RANDOMIZE
            (libc::SYS_personality, 0x0040000, eperm),
        ];
        for ns in [libc::CLONE_NEWUSER, libc::CLONE_NEWPID, libc::CLONE_NEWNS] {
            cases.push((libc::SYS_clone, ns as u64 | sigchld, eperm));
        }
        cases.extend(DENIED.iter().chain(DENIED_ARCH).map(|nr| (*nr, 0, eperm)));
        for (nr, arg0, verdict) in cases {
            assert_eq!(
                run(&p, nr as u32, AUDIT_ARCH, arg0),
                verdict,
                "syscall {nr}, arg0 {arg0:#x}"
            );
        }
        // Another ABI is killed outright.
        assert_eq!(
            run(&p, libc::SYS_read as u32, 0x4000_0003, 0),
            SECCOMP_RET_KILL_PROCESS
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(&p, 0x4000_0000, AUDIT_ARCH, 0),
            SECCOMP_RET_KILL_PROCESS
        );
    }
}
