//! Files gapscope writes: private to their owner (0700 directories, 0600
//! files) and, when root runs it under sudo, created as the user who ran
//! sudo (so the recording is theirs, and lands only where they may write).
//!
//! A directory another user can write in may hold links or files planted
//! for gapscope to write through. So ([`crate::safe_fs`]'s rule): a run's
//! directory is made fresh unless `-o` names it, held by fd from then on;
//! every file in it is created with O_EXCL|O_NOFOLLOW from that fd (an
//! entry already there is removed first, never written through); a file
//! that must appear whole is written under a random name and renamed into
//! place; nothing is ever chowned by name.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::safe_fs::{self, AsInvoker};

/// The user on whose behalf gapscope runs: the one behind `sudo` when
/// running as root under it, else the real user.
pub fn invoking_uid() -> u32 {
    match safe_fs::invoker() {
        Some(who) => who.uid,
        // SAFETY: getuid has no preconditions.
        None => unsafe { libc::getuid() },
    }
}

fn name_c(name: &str) -> io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A directory gapscope writes into, held open: what is created in it is
/// created there, whatever happens to its path meanwhile.
#[derive(Debug)]
pub struct OutDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl OutDir {
    /// `path`, named by the user: made (with its parents, 0700) if it does
    /// not exist; an existing directory is used as it is, never chowned (a
    /// link to one is followed under the `protected_symlinks` rule, see
    /// [`write_file`]).
    pub fn named(path: &Path) -> io::Result<OutDir> {
        let _as = AsInvoker::new();
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Self::open(path, true)
    }

    /// A new directory `name` (0700) in `parent`, made now; when the name
    /// is taken, `name-<random>` instead: a directory planted in advance
    /// under the predictable name is never used.
    pub fn fresh(parent: &Path, name: &str) -> io::Result<OutDir> {
        let _as = AsInvoker::new();
        let mut try_name = name.to_string();
        for _ in 0..8 {
            let path = parent.join(&try_name);
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    let d = Self::open(&path, false)?;
                    // Made by us a moment ago: anything else is a swap by
                    // someone who can write `parent`.
                    let m = File::from(d.fd.try_clone()?).metadata()?;
                    // SAFETY: geteuid has no preconditions.
                    let ours = [invoking_uid(), unsafe { libc::geteuid() }];
                    if !ours.contains(&m.uid()) || m.mode() & 0o077 != 0 {
                        return Err(io::Error::other("replaced while being made"));
                    }
                    return Ok(d);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    try_name = safe_fs::random_name(&format!("{name}-"));
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} and other names tried exist",
                parent.join(name).display()
            ),
        ))
    }

    /// The directory at `path`; a link to one only with `follow`, and then
    /// under the `protected_symlinks` rule.
    fn open(path: &Path, follow: bool) -> io::Result<OutDir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))?;
        let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() && follow => {
                link_may_be_followed(parent_of(path), &m)?;
            }
            _ => flags |= libc::O_NOFOLLOW,
        }
        // SAFETY: open with a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "is a symbolic link; name the directory itself",
                )
            } else {
                e
            });
        }
        Ok(OutDir {
            // SAFETY: a new fd owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (for messages and readers).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A path to `name` in this directory that resolves through the fd held
    /// (`/proc/self/fd/N/name`): for reading back what was written here,
    /// whatever became of the directory's own path.
    pub fn held_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{HELD}{}/{name}", self.fd.as_raw_fd()))
    }

    /// Subdirectory `name`, made if missing (0700); never through a link.
    pub fn subdir(&self, name: &str) -> io::Result<OutDir> {
        let c = name_c(name)?;
        let _as = AsInvoker::new();
        // SAFETY: mkdirat from our fd with a valid C string.
        let made = check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) });
        match made {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => self.subdir_existing(name),
        }
    }

    /// A new private file `name`, created here with O_EXCL|O_NOFOLLOW. An
    /// entry of that name that is not a directory (an earlier run's file,
    /// or a link planted there) is removed first, never written through.
    pub fn create(&self, name: &str) -> io::Result<File> {
        let c = name_c(name)?;
        let _as = AsInvoker::new();
        let open = || {
            // SAFETY: openat from our fd with a valid C string.
            let fd = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            };
            check(fd).map(|()| File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
        };
        match open() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // SAFETY: unlinkat from our fd with a valid C string: it
                // removes the entry itself, link or file, never a target.
                check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })?;
                open()
            }
            other => other,
        }
    }

    /// Writes `name` whole through `fill`: into a new file of a random name
    /// here, renamed over `name` only when complete, so a failure never
    /// leaves half a file and nothing already at `name` is written through.
    pub fn write_file(
        &self,
        name: &str,
        fill: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
    ) -> io::Result<()> {
        let to = name_c(name)?;
        let tmp_name = safe_fs::random_name(&format!(".{name}."));
        let tmp = name_c(&tmp_name)?;
        let _as = AsInvoker::new();
        let f = self.create(&tmp_name)?;
        let result = (|| {
            let mut w = io::BufWriter::new(f);
            fill(&mut w)?;
            io::Write::flush(&mut w)?;
            // SAFETY: renameat between entries of our own fd; it replaces
            // what is at `name` (a link too) without following it.
            check(unsafe {
                libc::renameat(
                    self.fd.as_raw_fd(),
                    tmp.as_ptr(),
                    self.fd.as_raw_fd(),
                    to.as_ptr(),
                )
            })
        })();
        if result.is_err() {
            // SAFETY: removes the entry we created, from our fd.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), tmp.as_ptr(), 0) };
        }
        result
    }

    /// Subdirectory `name` as it is, if it is one (not a link to one).
    pub fn subdir_existing(&self, name: &str) -> io::Result<OutDir> {
        let c = name_c(name)?;
        // SAFETY: openat from our fd with a valid C string.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        check(fd)?;
        Ok(OutDir {
            // SAFETY: a new fd owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: self.path.join(name),
        })
    }

    /// How long ago the entry `name` (itself, not what a link names) was
    /// last modified.
    pub fn age_of(&self, name: &str) -> Option<std::time::Duration> {
        let c = name_c(name).ok()?;
        // SAFETY: fstatat from our fd into a struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            return None;
        }
        let modified = std::time::UNIX_EPOCH
            + std::time::Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec as u32);
        modified.elapsed().ok()
    }

    /// Removes the subdirectory `name` if it is empty.
    pub fn remove_empty(&self, name: &str) -> io::Result<()> {
        let c = name_c(name)?;
        // SAFETY: unlinkat from our fd with a valid C string.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
    }

    /// Whether this directory holds nothing.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.entries()?.is_empty())
    }

    /// The names in this directory, read from its fd.
    pub fn entries(&self) -> io::Result<Vec<String>> {
        let p = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let mut out = Vec::new();
        for e in std::fs::read_dir(p)? {
            out.push(e?.file_name().to_string_lossy().into_owned());
        }
        Ok(out)
    }

    /// Removes the subdirectory `name` and everything in it, from this
    /// directory's fd down: never through a link (a link met is removed
    /// itself), never across a mount.
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        remove_tree_at(self.fd.as_fd(), name, 0)
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn remove_tree_at(dir: std::os::fd::BorrowedFd<'_>, name: &str, depth: u32) -> io::Result<()> {
    let c = name_c(name)?;
    // SAFETY: unlinkat from a held fd with a valid C string.
    if check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }).is_ok() {
        return Ok(());
    }
    if depth > 8 {
        return Err(io::Error::other("nested too deep"));
    }
    let sub = safe_fs::openat2(
        dir,
        Path::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        safe_fs::Resolve::Beneath,
    )?;
    let sub_dev = File::from(sub.try_clone()?).metadata()?.dev();
    let dev = File::from(dir.try_clone_to_owned()?).metadata()?.dev();
    if sub_dev != dev {
        return Err(io::Error::other("a mount point"));
    }
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))? {
        let n = e?.file_name();
        remove_tree_at(sub.as_fd(), &n.to_string_lossy(), depth + 1)?;
    }
    // SAFETY: as above; the directory is empty now.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
}

/// Writes a whole file at `path` (`report -o`) through `fill`. A regular
/// file, or none, is replaced whole as [`OutDir::write_file`] does. What
/// is there and is not a regular file — a device, a FIFO, a terminal, a
/// link to one (`/dev/stdout`) — is written through, as a shell's `>`
/// would; never replaced. A link to a regular file is written through
/// too, unless it sits in a sticky directory others can write (/tmp) and
/// belongs to neither gapscope's user nor the directory's owner: the
/// kernel's `protected_symlinks` rule, kept whatever the machine's setting.
pub fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let parent = parent_of(path);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() || !m.file_type().is_file() => {
            if m.file_type().is_symlink() {
                link_may_be_followed(parent, &m)?;
            }
            let _as = AsInvoker::new();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)?;
            let ft = f.metadata()?.file_type();
            if ft.is_dir() {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "a directory"));
            }
            let mut w = io::BufWriter::new(f);
            fill(&mut w)?;
            io::Write::flush(&mut w)
        }
        _ => OutDir::open(parent, true)?.write_file(name, fill),
    }
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The `protected_symlinks` rule for a link at `link`'s place in `dir`.
fn link_may_be_followed(dir: &Path, link: &std::fs::Metadata) -> io::Result<()> {
    let d = std::fs::metadata(dir)?;
    let sticky_shared = d.mode() & 0o1002 == 0o1002;
    let me = invoking_uid();
    // SAFETY: geteuid has no preconditions.
    let trusted = [me, unsafe { libc::geteuid() }, d.uid()];
    if sticky_shared && !trusted.contains(&link.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "a symbolic link of uid {} in a directory others can write; not followed",
                link.uid()
            ),
        ));
    }
    Ok(())
}

/// Where [`OutDir::held_path`]s begin.
const HELD: &str = "/proc/self/fd/";

/// Whether `path` runs through a folder gapscope holds open
/// ([`OutDir::held_path`]): what it names there gapscope wrote itself, and
/// is read back never through a link put in its place.
pub fn is_held(path: &Path) -> bool {
    path.starts_with(HELD)
}

/// Opens `path` to read a file gapscope reads whole: a regular file only
/// (a FIFO's open or read would wait for a writer forever, a device's read
/// need never end — the open does not wait, and anything else is refused),
/// and in a folder it holds open, never through a link ([`is_held`]).
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if is_held(path) {
        flags |= libc::O_NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // O_NONBLOCK changes nothing for a regular file's reads.
    Ok(f)
}

/// Whether the thing at `path` is a character device, a FIFO or a socket.
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| {
        let t = m.file_type();
        t.is_char_device() || t.is_fifo() || t.is_socket() || t.is_block_device()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn outputs_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let sub = OutDir::named(&dir.path().join("a/b")).unwrap();
        sub.create("report.txt").unwrap();
        assert_eq!(
            fs::metadata(sub.path()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            fs::metadata(sub.join("report.txt"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
    }

    /// A FIFO or device is refused without waiting for a writer; a link
    /// put at a name in a held folder is not followed, as it is when a
    /// user names it.
    #[test]
    fn reads_are_of_regular_files_and_not_through_links_in_held_folders() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutDir::named(&dir.path().join("run")).unwrap();
        let fifo = std::ffi::CString::new(out.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = open_regular(&out.held_path("fifo")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(open_regular(Path::new("/dev/zero")).is_err());
        fs::write(dir.path().join("elsewhere"), b"not ours").unwrap();
        symlink(dir.path().join("elsewhere"), out.join("session.gsz")).unwrap();
        let e = open_regular(&out.held_path("session.gsz")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert!(open_regular(&out.join("session.gsz")).is_ok());
    }

    #[test]
    fn failed_writes_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.svg");
        fs::write(&f, "old").unwrap();
        let err = write_file(&f, |w| {
            io::Write::write_all(w, b"half")?;
            Err(io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert_eq!(fs::read_to_string(&f).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        write_file(&f, |w| io::Write::write_all(w, b"new")).unwrap();
        assert_eq!(fs::read_to_string(&f).unwrap(), "new");
    }

    #[test]
    fn a_planted_link_is_replaced_not_written_through() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, "ORIGINAL").unwrap();
        let run = OutDir::named(&t.path().join("run")).unwrap();
        symlink(&victim, run.join("session.gsz")).unwrap();
        symlink(&victim, run.join("report.txt")).unwrap();
        io::Write::write_all(&mut run.create("session.gsz").unwrap(), b"S").unwrap();
        run.write_file("report.txt", |w| io::Write::write_all(w, b"R"))
            .unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "ORIGINAL");
        assert_eq!(fs::read_to_string(run.join("session.gsz")).unwrap(), "S");
        assert_eq!(fs::read_to_string(run.join("report.txt")).unwrap(), "R");
        assert!(!fs::symlink_metadata(run.join("report.txt"))
            .unwrap()
            .file_type()
            .is_symlink());
        // The temporary's name is random: nothing left beside.
        assert_eq!(run.entries().unwrap().len(), 2);
    }

    #[test]
    fn a_fresh_directory_never_reuses_one_made_before() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("gapscope-1-x")).unwrap();
        fs::write(t.path().join("gapscope-1-x/planted"), "").unwrap();
        let d = OutDir::fresh(t.path(), "gapscope-1-x").unwrap();
        assert_ne!(d.path(), t.path().join("gapscope-1-x"));
        assert!(d.is_empty().unwrap());
    }

    #[test]
    fn a_link_planted_in_a_shared_sticky_directory_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("tmp");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, "ORIGINAL").unwrap();
        let link = shared.join("report.txt");
        symlink(&victim, &link).unwrap();
        // Ours: followed, as a shell's `>` would.
        write_file(&link, |w| io::Write::write_all(w, b"mine")).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "mine");
        // Another user's: refused.
        let c = CString::new(link.as_os_str().as_bytes()).unwrap();
        // SAFETY: lchown with a valid C string.
        if unsafe { libc::lchown(c.as_ptr(), 4242, 4242) } != 0 {
            return; // not root: cannot make the other user's link
        }
        let e = write_file(&link, |w| io::Write::write_all(w, b"evil")).unwrap_err();
        assert!(e.to_string().contains("not followed"), "{e}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "mine");
        assert!(OutDir::named(&link).is_err());
    }

    #[test]
    fn a_device_is_written_through_never_replaced() {
        write_file(Path::new("/dev/null"), |w| io::Write::write_all(w, b"x")).unwrap();
        let m = fs::symlink_metadata("/dev/null").unwrap();
        assert!(m.file_type().is_char_device());
    }

    #[test]
    fn a_tree_is_removed_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let keep = t.path().join("keep");
        fs::create_dir(&keep).unwrap();
        fs::write(keep.join("important"), "x").unwrap();
        let d = OutDir::named(&t.path().join("d")).unwrap();
        let w = d.subdir("w").unwrap();
        w.create("session.gsz").unwrap();
        symlink(&keep, w.join("link")).unwrap();
        d.remove_tree("w").unwrap();
        assert!(d.is_empty().unwrap());
        assert!(keep.join("important").exists());
    }
}
