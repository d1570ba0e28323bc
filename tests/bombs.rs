//! Inputs built to cost far more to read than their size: `gapscope
//! report` must refuse them in one line, within a 1 GiB address space and
//! a few seconds of CPU, where before they took gigabytes (a killed or
//! aborted report) or minutes. Security review, findings 12 and 13.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gapscope::session::{wrap_records, Mode, Record, SessionHeader, SessionWriter};
use gapscope_tests::{gapscope, scratch};

/// Address space and CPU seconds a report of a bomb gets. Reading a real
/// trace or session of these sizes needs a small part of either; without
/// the caps each bomb below passed one or the other.
const MEMORY: u64 = 1 << 30;
const CPU_SECONDS: u64 = 20;

/// `gapscope report --format json PATH`, confined.
fn report_confined(path: &Path) -> Output {
    let mut cmd = Command::new(gapscope());
    cmd.args(["report", "--format", "json"])
        .arg(path)
        .stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for (resource, limit) in [(libc::RLIMIT_AS, MEMORY), (libc::RLIMIT_CPU, CPU_SECONDS)] {
                let l = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(resource, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.output().expect("running gapscope report")
}

/// The report failed with one line naming `needle`, and was not killed.
#[track_caller]
fn refused_in_one_line(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr:?}");
    assert!(lines[0].starts_with("gapscope: error: "), "{stderr:?}");
    assert!(lines[0].contains(needle), "{stderr:?} lacks {needle:?}");
}

#[test]
fn a_session_of_32_mi_empty_notes_is_refused() {
    let dir = scratch("bomb-gsz");
    let path = dir.path().join("bomb.gsz");
    // A real header chunk, then one chunk of 32 Mi empty notes (each two
    // bytes: variant 9, length 0): 64 MiB that zstd packs into a few KB.
    let mut w = SessionWriter::create(&path).unwrap();
    w.push(&Record::Header(SessionHeader {
        gapscope_version: "bomb".into(),
        mode: Mode::Run,
        target_pid: 1,
        command: vec!["bomb".into()],
        hostname: "h".into(),
        kernel: "k".into(),
        nr_cpus: 1,
        start_ns: 1,
        start_unix_ns: 1,
        sample_hz: 99,
    }))
    .unwrap();
    w.finish().unwrap();
    let notes = wrap_records(&[9u8, 0].repeat(32 << 20));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&notes[16..]).unwrap(); // its chunk, past the file header
    drop(f);
    assert!(std::fs::metadata(&path).unwrap().len() < 16 << 10);
    refused_in_one_line(&report_confined(&path), "decompression bomb");
}

/// A trace of 20 kernels timed `0e2147483640` (zero, with an exponent that
/// once cost two billion multiplications each), and `good` more.
fn slow_exponent_trace(path: &Path, good: usize) {
    let bad = r#"{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0e2147483640, "dur": 0e2147483640}"#;
    let fine =
        r#"{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5}"#;
    let mut events = vec![bad; 20];
    events.extend(std::iter::repeat_n(fine, good));
    let text = format!("{{\"traceEvents\": [{}]}}", events.join(",\n"));
    std::fs::write(path, text).unwrap();
}

#[test]
fn kernels_timed_with_huge_exponents_are_passed_over_at_once() {
    let dir = scratch("slow-exp");
    let path = dir.path().join("trace.json");
    slow_exponent_trace(&path, 1);
    let out = report_confined(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{:?}: {stderr}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.is_object());

    // With nothing else timed, the trace has no events to report on.
    slow_exponent_trace(&path, 0);
    refused_in_one_line(&report_confined(&path), "no complete events");
}

/// A gzip file of `text`, with `body` compressed once and its member
/// repeated `times` (gzip readers join members).
fn gzip_bomb(path: &Path, head: &str, body: u8, times: usize, tail: &str) {
    let gz = |bytes: &[u8]| {
        let mut child = Command::new("gzip")
            .args(["-9", "-c", "-n"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("gzip");
        let mut stdin = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        let feed = std::thread::spawn(move || stdin.write_all(&bytes).unwrap());
        let out = child.wait_with_output().unwrap();
        feed.join().unwrap();
        assert!(out.status.success());
        out.stdout
    };
    let member = gz(&vec![body; 1 << 20]);
    let mut bytes = gz(head.as_bytes());
    for _ in 0..times {
        bytes.extend_from_slice(&member);
    }
    bytes.extend(gz(tail.as_bytes()));
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_gzipped_trace_with_a_1_gib_kernel_name_is_refused() {
    let dir = scratch("gz-name");
    let path = dir.path().join("trace.json.gz");
    gzip_bomb(
        &path,
        r#"{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "name": ""#,
        b'a',
        1024,
        r#""}]}"#,
    );
    assert!(std::fs::metadata(&path).unwrap().len() < 2 << 20);
    refused_in_one_line(&report_confined(&path), "gunzip it first");
}

#[test]
fn a_gzipped_trace_of_1_gib_of_spaces_is_refused() {
    let dir = scratch("gz-spaces");
    let path = dir.path().join("trace.json.gz");
    gzip_bomb(&path, r#"{"traceEvents": ["#, b' ', 1024, "]}");
    refused_in_one_line(&report_confined(&path), "unpacks to more than 64 MiB");
}
