//! Entry points for the fuzz targets (fuzz/) and their bounded smoke run in
//! the tests: each takes arbitrary bytes through a real input path — a
//! session file, the shim's wire protocol, a PyTorch trace — and, where
//! something was read, through the whole analysis and every export. Any
//! panic is a bug; errors are fine.

use std::io::Write;
use std::path::PathBuf;

use crate::session;

/// A scratch file per process (and thread) for the path-based readers.
fn scratch(ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "gapscope-fuzz-{}-{:?}.{ext}",
        std::process::id(),
        std::thread::current().id()
    ))
}

/// Everything a user can ask of a session, into the void; returns the
/// JSON report.
fn analyse_all(s: impl Into<crate::session::Source>) -> Vec<u8> {
    use crate::export::{write, Format, Options, Subject, View};
    let a = analysis(s, true);
    let v = View::new(&a);
    for format in Format::ALL {
        let _ = write(
            Subject::Run(&v),
            &Options::new(format),
            &mut std::io::sink(),
        );
    }
    json(&v)
}

fn analysis(s: impl Into<crate::session::Source>, pictures: bool) -> crate::analyze::Analysis {
    crate::analyze::analyze(
        s,
        &crate::analyze::AnalyzeOptions {
            pictures,
            hta: true,
            ..Default::default()
        },
    )
    .expect("read once already")
}

fn json(v: &crate::export::View) -> Vec<u8> {
    use crate::export::{write, Format, Options, Subject};
    let mut json = Vec::new();
    let _ = write(Subject::Run(v), &Options::new(Format::Json), &mut json);
    json
}

/// Bytes as a whole session file.
pub fn session_file(data: &[u8]) {
    let path = scratch("gsz");
    if std::fs::write(&path, data).is_ok() {
        if let Ok(s) = session::read_session(&path) {
            let whole = analyse_all(s);
            // The streamed reading, keeping only the thread states the
            // attribution reads, must come to the same report as the whole
            // one that keeps everything.
            let streamed = crate::analyze::analyze_settling_every(
                path.clone(),
                &crate::analyze::AnalyzeOptions {
                    pictures: false,
                    hta: true,
                    ..Default::default()
                },
                1,
            )
            .expect("read once already");
            let streamed = json(&crate::export::View::new(&streamed));
            assert!(
                whole == streamed,
                "streamed and whole readings differ:\n{}\n---\n{}",
                String::from_utf8_lossy(&whole),
                String::from_utf8_lossy(&streamed)
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Bytes as the records of one chunk, wrapped into a file with a valid
/// header and checksum: past the integrity checks, into record decoding and
/// the analysis of whatever decodes.
pub fn session_records(data: &[u8]) {
    session_file(&session::wrap_records(data));
}

/// Bytes from the shim's socket, fed in pieces whose sizes the bytes pick.
pub fn wire_protocol(data: &[u8]) {
    let mut d = gapscope_wire::Decoder::new();
    let step = data.first().map_or(1, |b| *b as usize % 61 + 1);
    for piece in data.chunks(step) {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// Bytes as a PyTorch profiler trace file.
pub fn kineto_trace(data: &[u8]) {
    let path = scratch("json");
    if let Ok(mut f) = std::fs::File::create(&path) {
        if f.write_all(data).is_ok() {
            if let Ok(s) = crate::kineto::import(&path) {
                analyse_all(s);
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Seed inputs, one list per target: small valid inputs the mutations
/// start from (written as the fuzzers' corpora by `cargo xtask fuzz`).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "session_records" => vec![seed_records()],
        "session_file" => vec![session::wrap_records(&seed_records())],
        "wire_protocol" => vec![seed_frames()],
        "kineto_trace" => vec![SEED_TRACE.as_bytes().to_vec()],
        _ => Vec::new(),
    }
}

pub const TARGETS: [&str; 4] = [
    "session_file",
    "session_records",
    "wire_protocol",
    "kineto_trace",
];

/// Runs one target on one input.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "session_file" => session_file(data),
        "session_records" => session_records(data),
        "wire_protocol" => wire_protocol(data),
        "kineto_trace" => kineto_trace(data),
        other => panic!("no fuzz target {other}"),
    }
}

const SEED_TRACE: &str = r#"{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Seed GPU"}],
"traceEvents": [
{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 100, "tid": 100, "ts": 1000.000, "dur": 12.345, "args": {"External id": 1}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 1002.000, "dur": 4.100, "args": {"cbid": 211, "correlation": 1}},
{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1008.000, "dur": 9.875, "args": {"device": 0, "stream": 7, "correlation": 1, "grid": [128, 1, 1], "block": [256, 1, 1]}},
{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 1030.000, "dur": 3.000, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4096}},
{"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "pid": 100, "tid": 100, "ts": 1040.000, "dur": 50.000},
{"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "python"}}
]}"#;

fn seed_records() -> Vec<u8> {
    use crate::session::{
        Event, FdKind, Footer, GpuBatch, Mode, Record, SessionHeader, StopReason, SwitchOut,
    };
    use gapscope_wire::{ApiDomain, GpuRecord};
    let t = 1_000_000_000u64;
    let records = vec![
        Record::Header(SessionHeader {
            gapscope_version: "seed".into(),
            mode: Mode::Run,
            target_pid: 10,
            command: vec!["seed".into()],
            hostname: "h".into(),
            kernel: "k".into(),
            nr_cpus: 2,
            start_ns: t,
            start_unix_ns: 0,
            sample_hz: 99,
        }),
        Record::Event(Event::Switch {
            ts: t + 10,
            cpu: 0,
            out: None,
            in_: Some((10, 10)),
        }),
        Record::Event(Event::Syscall {
            ts: t + 20,
            pid: 10,
            tid: 10,
            dur: 5,
            nr: 0,
            fd: 3,
            fd_kind: FdKind::File,
            ret: 4096,
        }),
        Record::Gpu(GpuBatch {
            pid: 10,
            records: vec![
                GpuRecord::Api {
                    domain: ApiDomain::Runtime,
                    cbid: 211,
                    start: t + 30,
                    end: t + 40,
                    pid: 10,
                    tid: 10,
                    correlation: 1,
                },
                GpuRecord::Kernel {
                    start: t + 50,
                    end: t + 500,
                    device: 0,
                    context: 1,
                    stream: 7,
                    correlation: 1,
                    grid: [1; 3],
                    block: [1; 3],
                    name: "k".into(),
                },
            ],
        }),
        Record::Event(Event::ChargedSwitch {
            ts: t + 600,
            cpu: 0,
            out: Some(SwitchOut {
                pid: 10,
                tid: 10,
                state: 1,
                preempted: false,
                ustack: 0,
                kstack: 0,
                syscall: Some(0),
                fd: 4,
                fd_kind: FdKind::Pipe,
                next: (0, 0),
            }),
            in_: None,
            charged: 550,
        }),
        Record::GpuLost(crate::session::GpuLost {
            pid: 10,
            start: t + 650,
            end: t + 700,
            records: 2,
        }),
        Record::GpuBlind(crate::session::GpuBlind {
            pid: 10,
            start: t + 700,
            end: t + 900,
            reason: "seed".into(),
        }),
        Record::GpuSkipped {
            pid: 10,
            incomplete: 1,
            unknown: 2,
        },
        Record::End(Footer {
            end_ns: t + 1_000,
            reason: StopReason::TargetExited,
            exit_code: Some(0),
            events: 3,
        }),
    ];
    let mut out = Vec::new();
    for r in &records {
        let _ = postcard::to_io(r, &mut out);
    }
    out
}

fn seed_frames() -> Vec<u8> {
    use gapscope_wire::protocol::{encode, Frame};
    use gapscope_wire::{ClockMethod, GpuRecord, Hello};
    let mut out = Vec::new();
    encode(
        &Frame::Hello(Hello {
            version: gapscope_wire::protocol::VERSION,
            pid: 1,
            driver_version: 12090,
            cupti_version: 26,
            clock: ClockMethod::Native,
            source: "seed".into(),
        }),
        &mut out,
    );
    encode(
        &Frame::Records(vec![GpuRecord::Kernel {
            start: 1,
            end: 2,
            device: 0,
            context: 1,
            stream: 7,
            correlation: 1,
            grid: [1; 3],
            block: [1; 3],
            name: "k".into(),
        }]),
        &mut out,
    );
    encode(
        &Frame::Lost {
            start: 2,
            end: 5,
            records: 3,
        },
        &mut out,
    );
    encode(
        &Frame::Records(vec![GpuRecord::Range {
            start: 2,
            end: 4,
            tid: 1,
            name: "step 0".into(),
            domain: String::new(),
        }]),
        &mut out,
    );
    encode(
        &Frame::Blind {
            start: 5,
            reason: "seed".into(),
        },
        &mut out,
    );
    encode(&Frame::Sighted { at: 6 }, &mut out);
    encode(
        &Frame::Skipped {
            incomplete: 1,
            unknown: 2,
        },
        &mut out,
    );
    encode(&Frame::Info("seed".into()), &mut out);
    encode(&Frame::Goodbye, &mut out);
    out
}
