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
        one_line_error(&stderr, "hint: `gapscope");
    }
    let (code, _, stderr) = gapscope_cmd(&["attach", "--pid", "1", "--duration", "-3"]);
    assert_eq!(code, Some(2), "{stderr}");
    one_line_error(&stderr, "--duration must be a positive number");
    // What the mistake was is in the line: the missing argument, the
    // values allowed.
    let (_, _, stderr) = gapscope_cmd(&["run"]);
    one_line_error(&stderr, "<CMD>");
    let (_, _, stderr) = gapscope_cmd(&["report", "x", "--format", "pdf"]);
    one_line_error(&stderr, "possible values: text, json, md, html");
    // Asking for help is not a mistake.
    let (code, stdout, _) = gapscope_cmd(&["report", "--help"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("--format"), "{stdout}");
}

/// Runs `gapscope report --format json PATH` and returns (exit code,
/// stdout, stderr, its peak RSS in bytes).
fn report_with_rss(path: &std::path::Path) -> (Option<i32>, String, String, u64) {
    let dir = scratch("rss");
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    // Reaped with wait4 below, for its own rusage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(gapscope())
        .args(["report", "--format", "json"])
        .arg(path)
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as i32;
    // SAFETY: waiting for our own child, once.
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut ru) }, pid);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (
        code,
        std::fs::read_to_string(o).unwrap(),
        std::fs::read_to_string(e).unwrap(),
        ru.ru_maxrss as u64 * 1024,
    )
}

#[test]
fn damaged_sessions_read_up_to_the_damage_or_fail_in_one_line() {
    let dir = scratch("damaged");
    let good = std::fs::read(golden_session()).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    // A newer format than this gapscope reads: one line, exit 1.
    let mut newer = good.clone();
    newer[8..10].copy_from_slice(&(gapscope::session::FORMAT_VERSION + 1).to_le_bytes());
    let (code, _, stderr, _) = report_with_rss(&write("newer.gsz", &newer));
    assert_eq!(code, Some(1));
    one_line_error(&stderr, "newer");

    // Cut in the middle (a crash, a full disk): what came before reads,
    // marked truncated.
    let (code, stdout, stderr, _) = report_with_rss(&write("cut.gsz", &good[..good.len() / 2]));
    assert_eq!(code, Some(0), "{stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let why = r["session"]["truncated"].as_str().unwrap();
    assert!(why.contains("cut off"), "{why}");
    assert!(r["session"]["events"].as_u64().unwrap() > 1000);

    // Chunk headers claiming huge lengths: refused before anything of that
    // size is allocated.
    let first_chunk = 16;
    for (field, value) in [(0usize, u32::MAX), (4, u32::MAX), (4, 60 << 20)] {
        let mut bad = good.clone();
        bad[first_chunk + field..first_chunk + field + 4].copy_from_slice(&value.to_le_bytes());
        let (code, stdout, stderr, rss) = report_with_rss(&write("huge.gsz", &bad));
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            rss < 48 << 20,
            "peak RSS {rss} for a claimed length of {value}"
        );
        match code {
            // Nothing readable before the damage: no header, one line.
            Some(1) => one_line_error(&stderr, "huge.gsz"),
            Some(0) => {
                let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
                assert!(r["session"]["truncated"].is_string());
            }
            other => panic!("exit {other:?}: {stderr}"),
        }
    }
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

/// `report --code`: a rule of the user's names their own function as a
/// region of the job, in the order given and before the built-in table. The
/// samples the region gets are those of the stacks through the function, as
/// the on-CPU flamegraph's folded stacks count them; a malformed rule is a
/// one-line error and exit 2.
#[test]
fn report_names_the_users_own_code_with_code_rules() {
    let session = golden_session();
    let s = session.to_str().unwrap();
    let folded = String::from_utf8(gapscope_stdout(&[
        "export",
        s,
        "--flamegraph",
        "cpu",
        "--folded",
    ]))
    .unwrap();
    let through_burn: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(stack, _)| stack.split(';').any(|f| f == "simtrain::burn"))
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum();
    assert!(through_burn > 0, "{folded}");
    let in_region = |extra: &[&str], region: &str| -> u64 {
        let mut args = vec!["report", s, "--format", "json"];
        args.extend_from_slice(extra);
        let report: serde_json::Value = serde_json::from_slice(&gapscope_stdout(&args)).unwrap();
        report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["code"].as_array().unwrap())
            .filter(|c| c["region"] == region)
            .map(|c| c["samples"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(in_region(&[], "input.transform"), 0);
    let mine = ["--code", "input.transform=sym:simtrain::burn"];
    assert_eq!(in_region(&mine, "input.transform"), through_burn);
    // Two rules for one frame: the first given stands.
    let both = [
        "--code",
        "input.transform=sym:simtrain::burn",
        "--code",
        "logging=sym:simtrain::burn",
    ];
    assert_eq!(in_region(&both, "input.transform"), through_burn);
    assert_eq!(in_region(&both, "logging"), 0);

    let (code, stdout, stderr) = gapscope_cmd(&["report", s, "--code", "decode=py:x"]);
    assert_eq!(code, Some(2));
    assert!(stdout.is_empty());
    one_line_error(&stderr, "code rule 'decode=py:x': no region 'decode'");
}
