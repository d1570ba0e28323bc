//! `cargo xtask wheel`: gapscope as a Python wheel, for `pip install`.
//!
//! Assembled by hand (a wheel is a zip with a fixed layout): the release
//! `gapscope` binary (its BPF object is inside it) and the CUPTI shim beside
//! it in the `gapscope` package's `bin/`, where the binary looks for the
//! shim; a `gapscope` console script and `python -m gapscope` that exec it.
//! The platform tag is the newest glibc symbol version the two need
//! (`manylinux_2_<minor>_x86_64`), read from their ELF version references;
//! CI checks it with auditwheel.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::{cargo, root, run};

const NAME: &str = "gapscope";

/// The package's Python side: where the binary is, and running it.
const INIT_PY: &str = r#""""gapscope: why your GPUs sit idle, and what to fix.

The wheel carries the `gapscope` binary and its CUPTI shim in this package's
bin/ folder; the `gapscope` command (and `python -m gapscope`) runs it.
"""

import os

__version__ = "@VERSION@"


def binary() -> str:
    """The path of the bundled gapscope binary."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "gapscope")
"#;

const MAIN_PY: &str = r#""""`python -m gapscope` and the `gapscope` command: the bundled binary,
run in this process's place (same pid, signals and exit code)."""

import os
import sys

from . import binary


def main() -> None:
    exe = binary()
    try:
        os.execv(exe, [exe] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write(f"gapscope: error: cannot run {exe}: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
"#;

/// Builds the wheel into target/wheels/ and returns its path.
pub fn wheel() -> Result<PathBuf> {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "gapscope",
        "-p",
        "gapscope-cupti",
    ]))?;
    let release = root().join("target/release");
    let version = env!("CARGO_PKG_VERSION");
    let staged = root().join("target/wheel-stage");
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged)?;
    // Debug info off (it is most of the size); symbols stay, for backtraces.
    let mut binaries = Vec::new();
    for name in [NAME, "libgapscope_cupti.so"] {
        let to = staged.join(name);
        run(Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&to)
            .arg(release.join(name)))?;
        binaries.push((name, to));
    }
    let mut glibc = (2, 17);
    for (_, path) in &binaries {
        glibc = glibc.max(glibc_needed(path)?);
    }
    let tag = format!(
        "py3-none-manylinux_{}_{}_{}",
        glibc.0,
        glibc.1,
        std::env::consts::ARCH
    );
    let dist_info = format!("{NAME}-{version}.dist-info");
    let out_dir = root().join("target/wheels");
    std::fs::create_dir_all(&out_dir)?;
    let out = out_dir.join(format!("{NAME}-{version}-{tag}.whl"));

    let readme = std::fs::read_to_string(root().join("README.md"))?;
    let mut files: Vec<(String, Vec<u8>, bool)> = vec![
        (
            format!("{NAME}/__init__.py"),
            INIT_PY.replace("@VERSION@", version).into_bytes(),
            false,
        ),
        (
            format!("{NAME}/__main__.py"),
            MAIN_PY.as_bytes().to_vec(),
            false,
        ),
    ];
    for (name, path) in &binaries {
        files.push((format!("{NAME}/bin/{name}"), std::fs::read(path)?, true));
    }
    files.push((
        format!("{dist_info}/METADATA"),
        metadata(version, &readme).into_bytes(),
        false,
    ));
    files.push((
        format!("{dist_info}/WHEEL"),
        format!(
            "Wheel-Version: 1.0\nGenerator: gapscope-xtask\nRoot-Is-Purelib: false\nTag: {tag}\n"
        )
        .into_bytes(),
        false,
    ));
    files.push((
        format!("{dist_info}/entry_points.txt"),
        format!("[console_scripts]\n{NAME} = {NAME}.__main__:main\n").into_bytes(),
        false,
    ));
    let mut record = String::new();
    for (path, bytes, _) in &files {
        record.push_str(&format!(
            "{path},sha256={},{}\n",
            urlsafe_b64(&Sha256::digest(bytes)),
            bytes.len()
        ));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    files.push((format!("{dist_info}/RECORD"), record.into_bytes(), false));

    let file =
        std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut zip = zip::ZipWriter::new(file);
    for (path, bytes, executable) in &files {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(if *executable { 0o755 } else { 0o644 });
        zip.start_file(path.as_str(), options)?;
        zip.write_all(bytes)?;
    }
    zip.finish()?;
    let _ = std::fs::remove_dir_all(&staged);
    eprintln!(
        "xtask: wheel: {} ({:.1} MiB; needs glibc {}.{}+)",
        out.display(),
        std::fs::metadata(&out)?.len() as f64 / (1 << 20) as f64,
        glibc.0,
        glibc.1
    );
    Ok(out)
}

/// The newest GLIBC_x.y symbol version `elf` refers to.
fn glibc_needed(elf: &Path) -> Result<(u32, u32)> {
    let out = Command::new("readelf")
        .args(["--version-info", "--wide"])
        .arg(elf)
        .output()
        .context("running readelf (binutils)")?;
    if !out.status.success() {
        bail!("readelf {} failed", elf.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let newest = text
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let v: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max();
    newest.with_context(|| format!("{}: no GLIBC symbol versions", elf.display()))
}

fn metadata(version: &str, readme: &str) -> String {
    format!(
        "Metadata-Version: 2.1\n\
         Name: {NAME}\n\
         Version: {version}\n\
         Summary: Why your GPUs sit idle: an eBPF and CUPTI profiler that names the cause and the fix\n\
         License: MIT OR Apache-2.0\n\
         Requires-Python: >=3.8\n\
         Classifier: Operating System :: POSIX :: Linux\n\
         Classifier: Environment :: GPU :: NVIDIA CUDA\n\
         Description-Content-Type: text/markdown\n\
         \n\
         {readme}"
    )
}

/// Base64 with the URL-safe alphabet and no padding (a wheel's RECORD).
fn urlsafe_b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn urlsafe_base64_without_padding() {
        assert_eq!(super::urlsafe_b64(b""), "");
        assert_eq!(super::urlsafe_b64(b"f"), "Zg");
        assert_eq!(super::urlsafe_b64(b"fo"), "Zm8");
        assert_eq!(super::urlsafe_b64(b"foo"), "Zm9v");
        assert_eq!(super::urlsafe_b64(&[0xfb, 0xff]), "-_8");
    }
}
