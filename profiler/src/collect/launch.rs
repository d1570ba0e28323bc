//! Starting the target so that not one of its events is missed: fork a
//! child that waits on a pipe, let the caller put its pid in the kernel
//! filter and attach, then release it to exec.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: permission denied")]
    PermissionDenied(String),
    #[error("{cmd}: cannot execute: {source}")]
    Exec {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the target: {0}")]
    Os(#[source] std::io::Error),
    #[error("no command given")]
    Empty,
}

impl LaunchError {
    /// What a shell would exit with.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::NotFound(_) => 127,
            LaunchError::PermissionDenied(_) | LaunchError::Exec { .. } => 126,
            LaunchError::Os(_) | LaunchError::Empty => 125,
        }
    }
}

/// Finds the program like execvp would.
pub fn resolve(program: &str) -> Result<PathBuf, LaunchError> {
    let is_exec = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if !p.exists() {
            Err(LaunchError::NotFound(program.into()))
        } else if is_exec(&p) {
            Ok(p)
        } else {
            Err(LaunchError::PermissionDenied(program.into()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_exec(p))
        .ok_or_else(|| LaunchError::NotFound(program.into()))
}

/// A forked child stopped just before exec.
pub struct Paused {
    pid: u32,
    go: OwnedFd,
    status: OwnedFd,
    cmd: String,
}

fn cstring(s: &OsStr) -> Result<CString, LaunchError> {
    CString::new(s.as_bytes()).map_err(|_| {
        LaunchError::Os(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "argument contains a NUL byte",
        ))
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), LaunchError> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(LaunchError::Os(std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks a child that will exec `argv` with `env` once released.
pub fn spawn_paused(argv: &[String], env: &[(OsString, OsString)]) -> Result<Paused, LaunchError> {
    let program = argv.first().ok_or(LaunchError::Empty)?;
    let path = resolve(program)?;
    // Everything the child touches is prepared here: after fork it may only
    // make async-signal-safe calls.
    let path_c = cstring(path.as_os_str())?;
    let argv_c: Vec<CString> = argv
        .iter()
        .map(|a| cstring(OsStr::new(a)))
        .collect::<Result<_, _>>()?;
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let env_c: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect::<Result<_, _>>()?;
    let mut env_p: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    env_p.push(std::ptr::null());

    let (go_r, go_w) = pipe()?;
    let (status_r, status_w) = pipe()?;

    // SAFETY: the child only calls async-signal-safe functions before exec.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(LaunchError::Os(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // Child.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut byte = 0u8;
            let n = libc::read(go_r.as_raw_fd(), &mut byte as *mut u8 as *mut _, 1);
            if n != 1 {
                // The profiler went away before releasing us: never run untraced.
                libc::_exit(125);
            }
            libc::execve(path_c.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(
                status_w.as_raw_fd(),
                &errno as *const i32 as *const _,
                std::mem::size_of::<i32>(),
            );
            libc::_exit(127);
        }
    }
    drop(go_r);
    drop(status_w);
    Ok(Paused {
        pid: pid as u32,
        go: go_w,
        status: status_r,
        cmd: program.clone(),
    })
}

impl Paused {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exec; returns once it has (or failed to).
    pub fn release(self) -> Result<(), LaunchError> {
        let byte = 1u8;
        // SAFETY: writing one byte from a live buffer to an fd we own.
        let n = unsafe { libc::write(self.go.as_raw_fd(), &byte as *const u8 as *const _, 1) };
        if n != 1 {
            return Err(LaunchError::Os(std::io::Error::last_os_error()));
        }
        let mut errno = 0i32;
        let n = loop {
            // SAFETY: reading into a live i32.
            let n = unsafe {
                libc::read(
                    self.status.as_raw_fd(),
                    &mut errno as *mut i32 as *mut _,
                    std::mem::size_of::<i32>(),
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break n;
        };
        if n <= 0 {
            return Ok(()); // EOF: the close-on-exec pipe closed, exec succeeded.
        }
        let source = std::io::Error::from_raw_os_error(errno);
        Err(match errno {
            libc::ENOENT => LaunchError::NotFound(self.cmd),
            libc::EACCES | libc::EPERM => LaunchError::PermissionDenied(self.cmd),
            _ => LaunchError::Exec {
                cmd: self.cmd,
                source,
            },
        })
    }

    /// Kills the paused child (used when recording cannot start).
    pub fn abort(self) {
        // SAFETY: plain syscalls on our own child.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
            libc::waitpid(self.pid as i32, std::ptr::null_mut(), 0);
        }
    }
}

pub use crate::session::exit_code_of;

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(OsString, OsString)> {
        std::env::vars_os().collect()
    }

    fn wait(pid: u32) -> i32 {
        let mut status = 0;
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        exit_code_of(status)
    }

    #[test]
    fn runs_only_after_release_and_reports_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let script = format!("touch {} && exit 7", marker.display());
        let p = spawn_paused(&["sh".into(), "-c".into(), script], &env()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "child ran before release");
        let pid = p.pid();
        p.release().unwrap();
        assert_eq!(wait(pid), 7);
        assert!(marker.exists());
    }

    #[test]
    fn missing_command_is_127() {
        let err = spawn_paused(&["gapscope-no-such-command".into()], &env())
            .err()
            .unwrap();
        assert_eq!(err.exit_code(), 127);
        assert_eq!(
            err.to_string(),
            "gapscope-no-such-command: command not found"
        );
    }

    #[test]
    fn signal_death_is_128_plus_signal() {
        let p = spawn_paused(&["sh".into(), "-c".into(), "kill -TERM $$".into()], &env()).unwrap();
        let pid = p.pid();
        p.release().unwrap();
        assert_eq!(wait(pid), 128 + libc::SIGTERM);
    }
}
