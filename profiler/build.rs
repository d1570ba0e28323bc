//! Compiles the kernel side (ebpf/*.bpf.c) with clang into OUT_DIR, where
//! `collect::bpf` embeds it with `include_bytes_aligned!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn find_clang() -> Result<String> {
    if let Ok(clang) = env::var("GAPSCOPE_CLANG") {
        return Ok(clang);
    }
    for candidate in ["clang-19", "clang-20", "clang-18", "clang"] {
        let ok = Command::new(candidate)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Ok(candidate.to_string());
        }
    }
    bail!(
        "no clang found to compile the BPF programs; run `cargo xtask setup` \
         (installs clang-19 and libbpf-dev) or set GAPSCOPE_CLANG"
    )
}

fn main() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf = manifest
        .join("../ebpf")
        .canonicalize()
        .context("ebpf/ directory")?;
    let out = PathBuf::from(env::var("OUT_DIR")?);

    for file in ["gapscope.bpf.c", "gapscope.h", "vmlinux.h"] {
        println!("cargo:rerun-if-changed={}", ebpf.join(file).display());
    }
    println!("cargo:rerun-if-env-changed=GAPSCOPE_CLANG");

    let arch = match env::var("CARGO_CFG_TARGET_ARCH")?.as_str() {
        "x86_64" => "x86",
        other => bail!("gapscope's BPF programs support x86_64 only (target: {other})"),
    };
    compile(&find_clang()?, &ebpf, arch, &out.join("gapscope.bpf.o"))
}

fn compile(clang: &str, ebpf: &Path, arch: &str, obj: &Path) -> Result<()> {
    let output = Command::new(clang)
        .args([
            "-target", "bpf", "-g", "-O2", "-mcpu=v3", "-Wall", "-Werror",
        ])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg("-I")
        .arg(ebpf)
        .arg("-c")
        .arg(ebpf.join("gapscope.bpf.c"))
        .arg("-o")
        .arg(obj)
        .output()
        .with_context(|| format!("running {clang}"))?;
    if !output.status.success() {
        bail!(
            "compiling ebpf/gapscope.bpf.c failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
