//! A CPython 3.12+ for the tests of Python frames in stacks. None can be
//! installed from the registries the project builds from (Debian 12 ships
//! 3.11, PyPI carries no interpreters), so Debian 13's copy of the upstream
//! 3.13 source is built once, with frame pointers (as Fedora and Ubuntu
//! 24.04 build theirs, so that stacks walk through the interpreter), into
//! target/python3.13/. Best effort: the tests that need it skip without it
//! (and fail under GAPSCOPE_REQUIRE_PYTHON=1).

use std::process::Command;

use sha2::{Digest, Sha256};

use crate::root;

/// Where it is installed, relative to the workspace.
pub const PYTHON_DIR: &str = "target/python3.13";
const SOURCE: &str =
    "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz";
/// As Debian's source index (trixie's Sources) gives it.
const SHA256: &str = "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640";

pub fn python_with_frame_pointers() {
    let prefix = root().join(PYTHON_DIR);
    if prefix.join("bin/python3.13").exists() {
        return;
    }
    eprintln!("xtask: setup: building CPython 3.13 with frame pointers into {PYTHON_DIR} (a few minutes, once)");
    if let Err(e) = build(&prefix) {
        eprintln!(
            "xtask: setup: could not build CPython 3.13 ({e:#}); the tests of Python frames will skip (fail under GAPSCOPE_REQUIRE_PYTHON=1)"
        );
        let _ = std::fs::remove_dir_all(&prefix);
    }
}

fn build(prefix: &std::path::Path) -> anyhow::Result<()> {
    let work = root().join("target/python3.13-build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let tarball = work.join("source.tar.xz");
    crate::run(
        Command::new("curl")
            .args(["-sSfL", "--retry", "3", "-o"])
            .arg(&tarball)
            .arg(SOURCE),
    )?;
    let digest = Sha256::digest(std::fs::read(&tarball)?);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    anyhow::ensure!(hex == SHA256, "{SOURCE}: sha256 {hex}, expected {SHA256}");
    crate::run(
        Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work),
    )?;
    let src = work.join("Python-3.13.5");
    // The compiler's chatter goes to a log, kept when a step fails.
    let log = work.join("build.log");
    let logged = |cmd: &mut Command| -> anyhow::Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        cmd.current_dir(&src).stdout(out.try_clone()?).stderr(out);
        crate::run(cmd).map_err(|e| anyhow::anyhow!("{e:#}; see {}", log.display()))
    };
    logged(
        Command::new(src.join("configure"))
            .arg(format!("--prefix={}", prefix.display()))
            .arg("CFLAGS=-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"),
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    logged(Command::new("make").arg(format!("-j{jobs}")))?;
    logged(Command::new("make").arg("install"))?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
