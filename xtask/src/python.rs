//! CPythons for the tests of Python frames in stacks, beside whatever the
//! machine has (its own 3.11, pyenv's versions). No registry the project
//! builds from installs a 3.12+ (Debian 12 ships 3.11, PyPI carries no
//! interpreters), so Debian's copies of the upstream sources are built once
//! into target/python3.X/: 3.13 with frame pointers (as Fedora and Ubuntu
//! 24.04 build theirs, so that native stacks walk through the interpreter)
//! and 3.14 without (as most distributions and pyenv build theirs). Best
//! effort: the tests that need them skip without them (and fail under
//! GAPSCOPE_REQUIRE_PYTHON=1).

use std::process::Command;

use sha2::{Digest, Sha256};

use crate::root;

/// One interpreter to build.
struct Build {
    version: &'static str,
    source: &'static str,
    /// Of the tarball, as Debian's source index gives it (3.13.5: trixie's
    /// Sources) or as first fetched from its pool (3.14.7).
    sha256: &'static str,
    frame_pointers: bool,
}

const BUILDS: [Build; 2] = [
    Build {
        version: "3.13.5",
        source: "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz",
        sha256: "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640",
        frame_pointers: true,
    },
    Build {
        version: "3.14.7",
        source: "http://deb.debian.org/debian/pool/main/p/python3.14/python3.14_3.14.7.orig.tar.xz",
        sha256: "3b48dac8fb59f62eaa67ac83c1eb12bda1b7a08406dd286e252c11a66be27f81",
        frame_pointers: false,
    },
];

pub fn pythons() {
    for b in &BUILDS {
        let minor = &b.version[..b.version.rfind('.').unwrap_or(b.version.len())];
        let dir = format!("target/python{minor}");
        let prefix = root().join(&dir);
        if prefix.join(format!("bin/python{minor}")).exists() {
            continue;
        }
        let fp = if b.frame_pointers { "with" } else { "without" };
        eprintln!(
            "xtask: setup: building CPython {} {fp} frame pointers into {dir} (a few minutes, once)",
            b.version
        );
        if let Err(e) = build(b, &prefix) {
            eprintln!(
                "xtask: setup: could not build CPython {} ({e:#}); the tests of Python frames on it will skip (fail under GAPSCOPE_REQUIRE_PYTHON=1)",
                b.version
            );
            let _ = std::fs::remove_dir_all(&prefix);
        }
    }
}

fn build(b: &Build, prefix: &std::path::Path) -> anyhow::Result<()> {
    let (source, sha256) = (b.source, b.sha256);
    let work = root().join(format!("target/python{}-build", b.version));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let tarball = work.join("source.tar.xz");
    crate::run(
        Command::new("curl")
            .args(["-sSfL", "--retry", "3", "-o"])
            .arg(&tarball)
            .arg(source),
    )?;
    let digest = Sha256::digest(std::fs::read(&tarball)?);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    anyhow::ensure!(hex == sha256, "{source}: sha256 {hex}, expected {sha256}");
    crate::run(
        Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work),
    )?;
    let src = work.join(format!("Python-{}", b.version));
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
    let mut configure = Command::new(src.join("configure"));
    configure.arg(format!("--prefix={}", prefix.display()));
    if b.frame_pointers {
        configure.arg("CFLAGS=-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer");
    }
    logged(&mut configure)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    logged(Command::new("make").arg(format!("-j{jobs}")))?;
    logged(Command::new("make").arg("install"))?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
