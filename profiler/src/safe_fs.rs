//! One discipline for every path that someone other than gapscope's user
//! can influence. gapscope runs as root beside processes it does not trust:
//! a path inside their files (a perf map, a mapped library, their /tmp, a
//! label file) or in a directory they can write could be a symbolic link to
//! a root-only file, a FIFO that never answers, a mount over something
//! else, or a file that never ends. So such a path is
//!
//! - resolved from a directory fd with `openat2`: never through a symbolic
//!   link (inside a process's own root: only through links that stay in
//!   it), never through a /proc magic link, never above its directory, and
//!   where it matters never across a mount ([`Resolve`]);
//! - opened non-blocking (a FIFO cannot hold the open) and accepted only if
//!   `fstat` says it is a regular file ([`open_regular_at`]), then read up
//!   to a cap ([`read_capped`]);
//! - where even that could block (a FUSE file system the process mounted),
//!   read on a thread of its own with a deadline ([`within`]).
//!
//! A file mapped by a process is opened through `/proc/PID/map_files`
//! ([`open_mapping`]): the exact inode it mapped, whatever its path now
//! names, in whatever mount namespace.
//!
//! Writing follows the same rule from the other side (`output`): files are
//! created in a directory held open, with O_EXCL|O_NOFOLLOW, and under sudo
//! as the user who ran it ([`AsInvoker`]), so the kernel's own permission
//! checks say where that user may write.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::time::Duration;

/// How a path is resolved from its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    /// Below the directory, through no symbolic link and no mount point.
    Beneath,
    /// Below the directory, through relative links that stay below it (a
    /// Kubernetes secret volume's `..data` links), through no mount point.
    BeneathLinks,
    /// As the process whose root the directory is would resolve it: links
    /// are followed, `/` and `..` stop at that root.
    InRoot,
}

impl Resolve {
    fn flags(self) -> u64 {
        match self {
            Resolve::Beneath => {
                libc::RESOLVE_BENEATH
                    | libc::RESOLVE_NO_SYMLINKS
                    | libc::RESOLVE_NO_MAGICLINKS
                    | libc::RESOLVE_NO_XDEV
            }
            Resolve::BeneathLinks => {
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_XDEV
            }
            Resolve::InRoot => libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        }
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd, returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat2(dir, path, flags, mode, resolve)`. Where the kernel or a
/// seccomp policy has no openat2, the path is walked a component at a
/// time with O_NOFOLLOW and no `..`: stricter than asked (no link is
/// followed at all), never looser.
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: Resolve,
) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: open_how is plain data; all zeroes is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    // The kernel refuses a mode without a flag that creates.
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = resolve.flags();
    // SAFETY: openat2 with a valid C string and a filled open_how of the
    // size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    match owned(fd) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
            walk_nofollow(dir, path, flags, mode)
        }
        other => other,
    }
}

/// The fallback of [`openat2`]: each directory opened O_PATH|O_NOFOLLOW
/// from the last, the leaf with O_NOFOLLOW.
fn walk_nofollow(dir: BorrowedFd<'_>, path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::RootDir | Component::CurDir => None,
            Component::ParentDir | Component::Prefix(_) => Some(Err(())),
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| io::Error::new(io::ErrorKind::InvalidInput, "`..` in the path"))?;
    let Some((leaf, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty path"));
    };
    let mut at: Option<OwnedFd> = None;
    for d in dirs {
        let from = at.as_ref().map_or(dir, |f| f.as_fd());
        let c = cstr(Path::new(d))?;
        // SAFETY: openat with a valid C string.
        let fd = unsafe {
            libc::openat(
                from.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        at = Some(owned(fd as libc::c_long)?);
    }
    let from = at.as_ref().map_or(dir, |f| f.as_fd());
    let c = cstr(Path::new(leaf))?;
    // SAFETY: openat with a valid C string.
    let fd = unsafe {
        libc::openat(
            from.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    owned(fd as libc::c_long)
}

/// A directory gapscope itself names (never a path a target chose), held
/// for resolving paths below it.
pub fn dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: open with a valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    owned(fd as libc::c_long)
}

/// The root directory of process `pid`, as it sees it (its container's).
pub fn proc_root(pid: u32) -> io::Result<OwnedFd> {
    dir(Path::new(&format!("/proc/{pid}/root")))
}

fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
}

/// `f`'s metadata, if it is a regular file.
pub fn regular(f: &File) -> io::Result<std::fs::Metadata> {
    let m = f.metadata()?;
    if m.file_type().is_file() {
        Ok(m)
    } else {
        Err(not_regular())
    }
}

/// Opens `path` below `dir` for reading, as [`Resolve`] says: only a
/// regular file is returned, and opening never waits (O_NONBLOCK).
pub fn open_regular_at(dir: BorrowedFd<'_>, path: &Path, resolve: Resolve) -> io::Result<File> {
    // Links are the resolve flags' business (O_NOFOLLOW would refuse a
    // last component that `BeneathLinks` allows).
    let fd = openat2(
        dir,
        path,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
        resolve,
    )?;
    let f = File::from(fd);
    regular(&f)?;
    Ok(f)
}

/// Everything `r` holds, if that is at most `cap` bytes.
pub fn read_capped(r: impl Read, cap: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    r.take(cap.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes"),
        ));
    }
    Ok(out)
}

/// The file at `path` below `dir` ([`open_regular_at`]), whole, if it is at
/// most `cap` bytes.
pub fn read_regular_at(
    dir: BorrowedFd<'_>,
    path: &Path,
    resolve: Resolve,
    cap: u64,
) -> io::Result<Vec<u8>> {
    read_capped(open_regular_at(dir, path, resolve)?, cap)
}

/// The file mapped at `start..end` in process `pid`: the inode it mapped,
/// through `/proc/PID/map_files` (whatever its path names now, in its
/// mount namespace or ours), if it is a regular file.
pub fn open_mapping(pid: u32, start: u64, end: u64) -> io::Result<File> {
    let c = cstr(Path::new(&format!(
        "/proc/{pid}/map_files/{start:x}-{end:x}"
    )))?;
    // SAFETY: open with a valid C string. Following this magic link is
    // the point: it names the mapped inode itself.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    let f = File::from(owned(fd as libc::c_long)?);
    regular(&f)?;
    Ok(f)
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: for a
/// read that a file system under another user's control could hold for
/// ever. None when it did not finish in time (the thread is left to finish
/// or hang on its own, holding nothing of ours).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("gapscope-read".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

/// Random hex, for names no one can guess in advance.
pub fn random_name(prefix: &str) -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom fills the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy source: the clock and pid still differ per call.
        b = (crate::clock::monotonic_ns() ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}{hex}")
}

/// The user gapscope works for when root runs it under sudo: files are
/// created with their rights and belong to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
}

/// The (uid, gid) behind `sudo`, when running as root under it.
pub fn invoker() -> Option<Invoker> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    // sudo run by root itself changes nothing.
    (uid != 0).then_some(Invoker { uid, gid })
}

/// While alive, this thread's file-system identity is the invoking user's
/// (fsuid, fsgid and no other group): files it creates are theirs, and it
/// may create them only where they may. Nothing changes when there is no
/// invoking user. Only this thread is affected (setfsuid and the raw
/// setgroups syscall are per thread), and only its file-system checks:
/// signals, ptrace and BPF keep root's rights.
pub struct AsInvoker {
    restore: Option<(u32, u32, Vec<libc::gid_t>)>,
}

impl AsInvoker {
    pub fn new() -> AsInvoker {
        let Some(who) = invoker() else {
            return AsInvoker { restore: None };
        };
        // SAFETY: getgroups into a buffer of the size passed.
        let groups = unsafe {
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut g = vec![0 as libc::gid_t; n.max(0) as usize];
            let n = libc::getgroups(g.len() as i32, g.as_mut_ptr());
            g.truncate(n.max(0) as usize);
            g
        };
        let one = [who.gid as libc::gid_t];
        // SAFETY: the raw syscalls change this thread's credentials only
        // (glibc's wrappers would change every thread's).
        unsafe {
            libc::syscall(libc::SYS_setgroups, 1usize, one.as_ptr());
            let gid = libc::syscall(libc::SYS_setfsgid, who.gid) as u32;
            let uid = libc::syscall(libc::SYS_setfsuid, who.uid) as u32;
            AsInvoker {
                restore: Some((uid, gid, groups)),
            }
        }
    }
}

impl Default for AsInvoker {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AsInvoker {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.restore.take() {
            // SAFETY: as in new(); root's own ids back.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, uid);
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn d(p: &Path) -> OwnedFd {
        dir(p).unwrap()
    }

    #[test]
    fn links_fifos_and_escapes_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/real"), b"hello").unwrap();
        std::fs::write(root.join("secret"), b"root only").unwrap();
        symlink("/etc/hostname", root.join("sub/abs")).unwrap();
        symlink("real", root.join("sub/rel")).unwrap();
        symlink("../secret", root.join("sub/up")).unwrap();
        let fifo = cstr(&root.join("sub/fifo")).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let sub = d(&root.join("sub"));
        let read = |p: &str, r| read_regular_at(sub.as_fd(), Path::new(p), r, 100);
        assert_eq!(read("real", Resolve::Beneath).unwrap(), b"hello");
        for p in ["abs", "rel", "up", "../secret", "/etc/hostname"] {
            assert!(read(p, Resolve::Beneath).is_err(), "{p}");
        }
        // A relative link that stays below is fine where links are.
        assert_eq!(read("rel", Resolve::BeneathLinks).unwrap(), b"hello");
        assert!(read("up", Resolve::BeneathLinks).is_err());
        assert!(read("abs", Resolve::BeneathLinks).is_err());
        // A FIFO neither blocks the open nor is read.
        let e = read("fifo", Resolve::Beneath).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file");
        // In a root, `/` is that root.
        let r = d(root);
        let e = read_regular_at(r.as_fd(), Path::new("/sub/abs"), Resolve::InRoot, 100);
        assert!(e.is_err(), "an absolute link resolves inside the root");
        assert_eq!(
            read_regular_at(r.as_fd(), Path::new("/sub/up"), Resolve::InRoot, 100).unwrap(),
            b"root only"
        );
    }

    #[test]
    fn reads_stop_at_the_cap() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), vec![b'x'; 101]).unwrap();
        let r = d(t.path());
        let e = read_regular_at(r.as_fd(), Path::new("f"), Resolve::Beneath, 100).unwrap_err();
        assert_eq!(e.to_string(), "larger than 100 bytes");
        assert_eq!(
            read_regular_at(r.as_fd(), Path::new("f"), Resolve::Beneath, 101)
                .unwrap()
                .len(),
            101
        );
        // An endless file is read no further than the cap.
        let zero = d(Path::new("/dev"));
        let f = File::from(
            openat2(
                zero.as_fd(),
                Path::new("zero"),
                libc::O_RDONLY,
                0,
                Resolve::Beneath,
            )
            .unwrap(),
        );
        assert!(read_capped(f, 1 << 20).is_err());
    }

    #[test]
    fn the_fallback_walk_follows_no_link() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("a")).unwrap();
        std::fs::write(t.path().join("a/f"), b"1").unwrap();
        symlink("a", t.path().join("l")).unwrap();
        let r = d(t.path());
        let open = |p: &str| walk_nofollow(r.as_fd(), Path::new(p), libc::O_RDONLY, 0);
        assert!(open("a/f").is_ok());
        assert!(open("l/f").is_err());
        assert!(open("a/../a/f").is_err());
    }

    #[test]
    fn a_deadline_gives_up_on_a_read_that_hangs() {
        let t = tempfile::tempdir().unwrap();
        let fifo = cstr(&t.path().join("fifo")).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let p = t.path().join("fifo");
        // A blocking open of a FIFO with no writer waits for ever.
        let r = within(Duration::from_millis(100), move || std::fs::read(p));
        assert!(r.is_none());
        assert_eq!(within(Duration::from_secs(60), || 7), Some(7));
    }

    #[test]
    fn mapped_files_are_opened_by_inode() {
        let me = std::process::id();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let line = maps
            .lines()
            .find(|l| l.ends_with(exe.to_str().unwrap()))
            .unwrap();
        let (s, e) = line
            .split_whitespace()
            .next()
            .unwrap()
            .split_once('-')
            .unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        let f = open_mapping(me, s, e);
        if unsafe { libc::geteuid() } != 0 {
            // map_files needs CAP_SYS_ADMIN.
            return;
        }
        let m = f.unwrap().metadata().unwrap();
        let want = std::fs::metadata(&exe).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.dev(), m.ino()), (want.dev(), want.ino()));
    }
}
