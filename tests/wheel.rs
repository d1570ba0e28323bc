//! The wheel `cargo xtask wheel` builds, as a user gets it: installed with
//! pip into a fresh virtual environment (no network, nothing else in it),
//! the `gapscope` it puts on PATH records real commands — a file read whose
//! bytes are known, and a process the CUDA driver loads the wheel's own
//! CUPTI shim into — and `python -m gapscope` is the same program. auditwheel
//! (from PyPI) agrees with the platform tag the wheel claims.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gapscope_tests::*;
use serde_json::Value;

/// The wheel in target/wheels/, if one was built (`cargo xtask test` builds
/// it; under GAPSCOPE_REQUIRE_WHEEL=1 a missing one fails the test).
fn built_wheel(test: &str) -> Option<PathBuf> {
    let dir = target_dir().parent().unwrap().join("wheels");
    let version = env!("CARGO_PKG_VERSION");
    let found = std::fs::read_dir(&dir).ok().and_then(|d| {
        d.flatten().map(|e| e.path()).find(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("gapscope-{version}-"))
            })
        })
    });
    if found.is_none() {
        assert!(
            std::env::var("GAPSCOPE_REQUIRE_WHEEL").as_deref() != Ok("1"),
            "{test}: no wheel in {} (cargo xtask wheel builds it)",
            dir.display()
        );
        eprintln!("skipping {test}: no wheel built (cargo xtask wheel)");
    }
    found
}

fn installed(wheel: &Path, dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    succeed(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    succeed(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--no-index", "--disable-pip-version-check", "-q"])
            .arg(wheel),
    );
    venv
}

#[test]
fn a_fresh_venv_with_only_pip_records_and_reports() {
    let test = "a_fresh_venv_with_only_pip_records_and_reports";
    if !bpf_ready(test) {
        return;
    }
    let Some(wheel) = built_wheel(test) else {
        return;
    };
    let dir = scratch("wheel");
    let venv = installed(&wheel, dir.path());
    let gs = venv.join("bin/gapscope");
    // What pip put on PATH, and the module, are this version's binary.
    let version = |cmd: &mut Command| String::from_utf8(succeed(cmd).stdout).unwrap();
    let v = version(Command::new(&gs).arg("--version"));
    assert!(v.contains(env!("CARGO_PKG_VERSION")), "{v}");
    assert_eq!(
        version(Command::new(venv.join("bin/python")).args(["-m", "gapscope", "--version"])),
        v
    );

    let _lock = recording_lock();
    // A real command: 16 MiB read with O_DIRECT, every byte from the disk.
    let truth = dir.path().join("truth.jsonl");
    let rec = dir.path().join("rec");
    let out = Command::new(&gs)
        .args(["run", "-q", "--no-exports", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(workload())
        .args(["oread", "--mib", "16", "--dir"])
        .arg(dir.path())
        .arg("--truth")
        .arg(&truth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&truth)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let t = truth_of(&lines, "oread")[0];
    let report = wheel_report(&gs, &rec);
    let th = thread(&report, u64_of(t, "tid"));
    assert_eq!(u64_of(t, "bytes"), 16 << 20);
    assert_storage_reads(th, t);

    // The shim the wheel carries beside its binary is the one `run` gives a
    // CUDA process (here one whose "driver" loads it without a GPU).
    let rec = dir.path().join("rec-gpu");
    let out = Command::new(&gs)
        .args(["run", "-q", "--no-exports", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(bin("gs-inject-host"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let host: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(host["init_rc"], 1, "the shim was loaded and initialised");
    let report = wheel_report(&gs, &rec);
    let src = &report["gpu_sources"][0];
    assert_eq!((&src["pid"], &src["kind"]), (&host["pid"], &"cupti".into()));
}

/// `gapscope report --format json` with the installed binary.
fn wheel_report(gs: &Path, rec: &Path) -> Value {
    let out = succeed(
        Command::new(gs)
            .args(["report", "--format", "json"])
            .arg(rec),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// auditwheel reads the binaries' ELF symbol versions itself: the wheel's
/// tag must be one it agrees with.
#[test]
fn auditwheel_agrees_with_the_platform_tag() {
    let test = "auditwheel_agrees_with_the_platform_tag";
    let Some(wheel) = built_wheel(test) else {
        return;
    };
    let auditwheel = target_dir()
        .parent()
        .unwrap()
        .join("torch-venv/bin/auditwheel");
    if !auditwheel.exists() {
        assert!(
            std::env::var("GAPSCOPE_REQUIRE_WHEEL").as_deref() != Ok("1"),
            "{test}: auditwheel is not installed (cargo xtask setup installs it)"
        );
        eprintln!("skipping {test}: no auditwheel");
        return;
    }
    let claimed = wheel
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split('-')
        .nth(4)
        .unwrap()
        .trim_end_matches(".whl")
        .to_string();
    let out = succeed(Command::new(&auditwheel).arg("show").arg(&wheel));
    let said = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    // "is consistent with the following platform tag: "manylinux_2_34_x86_64"."
    assert!(
        said.contains(&format!("\"{claimed}\"")),
        "claimed {claimed}: {said}"
    );
}
