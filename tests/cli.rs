//! The command line without recording: errors are one clear line with a
//! non-zero exit, never a panic.

use std::process::Command;

use gapscope_tests::*;

fn gapscope_cmd(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(gapscope()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn one_line_error(stderr: &str, needle: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr:?}");
    assert!(lines[0].starts_with("gapscope: error: "), "{stderr:?}");
    assert!(lines[0].contains(needle), "{stderr:?} lacks {needle:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn report_of_a_missing_file() {
    let (code, stdout, stderr) = gapscope_cmd(&["report", "/nonexistent/session.gsz"]);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    one_line_error(&stderr, "No such file");
}

#[test]
fn report_of_a_foreign_file() {
    let dir = scratch("foreign");
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"hello, not a profile").unwrap();
    let (code, _, stderr) = gapscope_cmd(&["report", path.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "not a gapscope session");
    // JSON is taken for a trace, and an empty one says so.
    let path = dir.path().join("trace.json");
    std::fs::write(&path, b"{\"traceEvents\": []}").unwrap();
    let (code, _, stderr) = gapscope_cmd(&["report", path.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "not a Kineto trace: no complete events");
}

#[test]
fn report_of_random_bytes_and_of_an_empty_file() {
    let dir = scratch("random");
    let path = dir.path().join("session.gsz");
    let noise: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &noise).unwrap();
    let (code, _, stderr) = gapscope_cmd(&["report", path.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "not a gapscope session");
    std::fs::write(&path, b"").unwrap();
    let (code, _, stderr) = gapscope_cmd(&["report", path.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "not a gapscope session");
}

#[test]
fn attach_to_a_missing_pid() {
    if !bpf_ready("attach_to_a_missing_pid") {
        return;
    }
    let (code, _, stderr) = gapscope_cmd(&["attach", "--pid", "4194304"]);
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "no process with pid 4194304");
}

#[test]
fn misuse_exits_2() {
    for args in [
        &["run"][..],
        &["attach"],
        &["attach", "--pid", "abc"],
        &["report"],
        &["report", "x", "--format", "pdf"],
        &["frobnicate"],
    ] {
        let (code, _, stderr) = gapscope_cmd(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = gapscope_cmd(&["attach", "--pid", "1", "--duration", "-3"]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn recording_without_privileges_says_what_is_missing() {
    // Needs root to drop to an unprivileged user.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping recording_without_privileges_says_what_is_missing: not root");
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(gapscope())
        .args(["run", "--", "true"])
        .current_dir(std::env::temp_dir())
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    one_line_error(&stderr, "needs root or CAP_BPF and CAP_PERFMON");
    assert!(stderr.contains("hint:"), "{stderr}");
}
