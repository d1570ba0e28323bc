//! Files gapscope writes: private to their owner (0700 directories, 0600
//! files) and, when run under sudo, owned by the user who ran sudo, so the
//! recording can be read back without root.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// The user on whose behalf gapscope runs: the one behind `sudo` when
/// running as root under it, else the real user.
pub fn invoking_uid() -> u32 {
    match invoking_user() {
        Some((uid, _)) => uid,
        // SAFETY: getuid has no preconditions.
        None => unsafe { libc::getuid() },
    }
}

/// The (uid, gid) behind `sudo`, when running as root under it.
fn invoking_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    Some((uid, gid))
}

/// Gives `path` to the invoking user, if there is one.
pub fn hand_over(path: &Path) -> io::Result<()> {
    match invoking_user() {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
        None => Ok(()),
    }
}

/// Creates the output directory (and parents) private to its owner.
pub fn create_dir(path: &Path) -> io::Result<()> {
    if !path.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
    }
    hand_over(path)
}

/// Creates (or truncates) a private output file.
pub fn create_file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    hand_over(path)?;
    Ok(f)
}
/// Writes a whole file through `fill`: into a temporary sibling, renamed over
/// `path` only when complete, so a failure never leaves half a file behind.
pub fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".partial");
    let tmp = path.with_file_name(tmp_name);
    let result = create_file(&tmp).and_then(|f| {
        let mut w = io::BufWriter::new(f);
        fill(&mut w)?;
        io::Write::flush(&mut w)?;
        fs::rename(&tmp, path)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn outputs_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        create_dir(&sub).unwrap();
        let f = sub.join("report.txt");
        create_file(&f).unwrap();
        assert_eq!(
            fs::metadata(&sub).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
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
}
