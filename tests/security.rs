//! What gapscope may touch: only its target's tree (see also
//! recording.rs, a_process_outside_the_tree_never_appears), only the
//! invoking user's processes under sudo, nothing left behind in the kernel,
//! private outputs owned by the user who ran sudo, and a shim that obeys no
//! stranger.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use gapscope_tests::*;

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn under_sudo_attach_refuses_another_users_process_unless_told() {
    if !bpf_ready("under_sudo_attach_refuses_another_users_process_unless_told") {
        return;
    }
    let _lock = recording_lock();
    let scratch = scratch("owner");
    // Under sudo, outputs are created as the user who ran it: where that
    // user may write, here a folder of theirs.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let user_dir = scratch.path().join("nobody");
    std::fs::create_dir(&user_dir).unwrap();
    std::os::unix::fs::chown(&user_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let root_only = scratch.path().join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    let mut target = Command::new("sleep").arg("30").spawn().unwrap(); // root's
    let attach = |extra: &[&str], out: &std::path::Path| {
        Command::new(gapscope())
            .args(["attach", "-q", "--duration", "0.3", "-p"])
            .arg(target.id().to_string())
            .arg("-o")
            .arg(out)
            .args(extra)
            // As if `sudo gapscope` had been run by nobody.
            .env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = attach(&[], &user_dir.join("refused"));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("belongs to uid 0") && err.contains("--any-user"),
        "{err}"
    );
    assert!(
        !user_dir.join("refused").exists(),
        "nothing written when refused"
    );

    // Nothing lands where the user could not write themselves, and a
    // folder that exists is never handed to them.
    let denied = attach(&["--any-user"], &root_only.join("out"));
    let err = String::from_utf8_lossy(&denied.stderr);
    assert_eq!(denied.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(std::fs::read_dir(&root_only).unwrap().count(), 0);
    let existing = attach(&["--any-user"], &root_only);
    assert_eq!(existing.status.code(), Some(1));
    assert_eq!(std::fs::metadata(&root_only).unwrap().uid(), 0);

    let allowed = attach(&["--any-user"], &user_dir.join("allowed"));
    assert_eq!(
        allowed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    // The recording belongs to the user who ran sudo, privately.
    let rec = user_dir.join("allowed");
    let meta = std::fs::metadata(&rec).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (NOBODY, 0o700)
    );
    for f in std::fs::read_dir(&rec).unwrap() {
        let m = f.unwrap().metadata().unwrap();
        assert_eq!((m.uid(), m.permissions().mode() & 0o777), (NOBODY, 0o600));
    }
    let _ = target.kill();
    let _ = target.wait();
}

#[test]
fn nothing_is_left_pinned_in_the_kernel() {
    if !bpf_ready("nothing_is_left_pinned_in_the_kernel") {
        return;
    }
    let _lock = recording_lock();
    let list = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/sys/fs/bpf")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    // Programs and maps of gapscope, by name, as the kernel lists them.
    let ours = || -> usize {
        let out = Command::new("bpftool").args(["prog", "show"]).output();
        match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout).matches("gs_").count(),
            Err(_) => 0,
        }
    };
    // The kernel frees raw-tracepoint programs after a grace period: wait
    // for an earlier recording's to go before taking the baseline.
    let settle = || {
        let mut n = ours();
        for _ in 0..100 {
            if n == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            n = ours();
        }
        n
    };
    let (pinned, loaded) = (list(), settle());
    assert_eq!(loaded, 0, "gapscope programs loaded before the test");
    let dir = scratch("pins");
    let r = run(&dir.path().join("rec"), &["-q"], &["true"]);
    assert_eq!(r.code(), Some(0), "{}", r.stderr());
    assert_eq!(list(), pinned, "bpffs changed");
    // Unloaded when gapscope exits (bpftool, where installed, can tell).
    assert_eq!(settle(), 0, "gapscope's programs outlived it");
}

#[test]
fn a_stranger_cannot_switch_a_dormant_shim_on() {
    if !is_root() {
        eprintln!(
            "skipping a_stranger_cannot_switch_a_dormant_shim_on: needs root to be a stranger"
        );
        return;
    }
    let mut host = Command::new(bin("gs-inject-host"))
        .env("CUDA_INJECTION64_PATH", shim())
        .env_remove("GAPSCOPE_SOCKET")
        .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let name = gapscope_wire::transport::local_control_socket_name(host.id());
    // The address is built before forking: the child only makes syscalls.
    // SAFETY: a zeroed sockaddr_un is valid; the name fits (it is short).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char; // sun_path[0] = 0: abstract
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    // A child that becomes nobody, connects, and exits 0 if the shim hung
    // up without a word, 1 if it spoke, 2 or 3 on errors.
    // SAFETY: the child makes only raw syscalls and _exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            libc::setgroups(0, std::ptr::null());
            libc::setresgid(NOBODY, NOBODY, NOBODY);
            libc::setresuid(NOBODY, NOBODY, NOBODY);
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let mut connected = false;
            for _ in 0..400 {
                if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) == 0 {
                    connected = true;
                    break;
                }
                libc::usleep(5000);
            }
            if !connected {
                libc::_exit(3);
            }
            let tv = libc::timeval {
                tv_sec: 10,
                tv_usec: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            let mut buf = [0u8; 64];
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            libc::_exit(if n == 0 {
                0
            } else if n > 0 {
                1
            } else {
                2
            });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let _ = host.wait();
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "1: the shim spoke to a stranger; 2: no answer; 3: never connected"
    );
}

/// Every /proc/PID/cmdline or /proc/PID/environ (PID a number, thread
/// paths included) that the session's target opened, as it recorded it.
fn proc_identity_reads(s: &gapscope::session::Session) -> Vec<(u32, String)> {
    let pid = s.header().target_pid;
    s.events
        .iter()
        .filter_map(|e| match e {
            gapscope::session::Event::Open { pid: p, path, .. } if *p == pid => {
                let parts: Vec<&str> = path.split('/').collect();
                match parts.as_slice() {
                    ["", "proc", n, .., last] if *last == "cmdline" || *last == "environ" => {
                        Some((n.parse().ok()?, path.clone()))
                    }
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

/// The processes a session saw: its target, those it described, those
/// forked while it recorded.
fn session_pids(dir: &std::path::Path) -> std::collections::HashSet<u32> {
    let s = gapscope::session::read_session(dir).unwrap();
    let mut pids: std::collections::HashSet<u32> = s.processes.iter().map(|p| p.pid).collect();
    pids.insert(s.header().target_pid);
    for e in &s.events {
        if let gapscope::session::Event::Fork { pid, .. } = e {
            pids.insert(*pid);
        }
    }
    pids
}

#[test]
fn other_processes_command_lines_and_environments_are_never_read() {
    // gapscope recording gapscope: the outer recording holds every file the
    // inner one opened, so it shows which processes' command lines and
    // environments the inner one read — in run and in attach mode, with a
    // stranger process alive beside the target the whole time.
    if !bpf_ready("other_processes_command_lines_and_environments_are_never_read") {
        return;
    }
    let _lock = recording_lock();
    let dir = scratch("proc-reads");
    let mut stranger = Command::new("sleep").arg("30").spawn().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut tree = Command::new("sh")
        .args(["-c", "sleep 20 & sleep 20; wait"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let g = gapscope();
    let g = g.to_str().unwrap();
    let wl = workload();
    let w = work.to_str().unwrap();
    let tree_pid = tree.id().to_string();
    for (mode, inner_cmd) in [
        (
            "run",
            vec![
                g,
                "run",
                "-q",
                "--no-exports",
                "-o",
                "INNER",
                "--",
                "sh",
                "-c",
                &format!("{} forks --children 4 --dir {w}", wl.display()),
            ],
        ),
        (
            "attach",
            vec![
                g,
                "attach",
                "-q",
                "--no-exports",
                "--duration",
                "1",
                "-o",
                "INNER",
                "-p",
                &tree_pid,
            ],
        ),
    ] {
        let inner = dir.path().join(format!("{mode}-inner"));
        let inner_cmd: Vec<&str> = inner_cmd
            .iter()
            .map(|a| {
                if *a == "INNER" {
                    inner.to_str().unwrap()
                } else {
                    a
                }
            })
            .collect();
        let outer = run(
            &dir.path().join(format!("{mode}-outer")),
            // Every open recorded: only the per-syscall hooks see them all.
            &["-q", "--no-exports", "--freq", "0", "--syscalls", "all"],
            &inner_cmd,
        );
        assert_eq!(outer.code(), Some(0), "{mode}: {}", outer.stderr());
        let recorded = gapscope::session::read_session(&outer.dir).unwrap();
        let inner_gapscope = recorded.header().target_pid;
        let reads = proc_identity_reads(&recorded);
        let allowed = session_pids(&inner);
        // The outer recording does see such reads: those of the target's own.
        assert!(
            reads.iter().any(|(p, _)| allowed.contains(p)),
            "{mode}: no read of the target tree's command lines recorded: {reads:?}"
        );
        for (p, path) in &reads {
            assert!(
                allowed.contains(p) || *p == inner_gapscope,
                "{mode}: gapscope read {path}, of a process outside its target tree \
                 (stranger {}, tree {allowed:?})",
                stranger.id()
            );
        }
    }
    for c in [&mut stranger, &mut tree] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
