//! gs-shim-listen: the profiler's end of the CUPTI shim's socket, alone.
//! It runs a command with the shim injected (`CUDA_INJECTION64_PATH` and
//! `NVTX_INJECTION64_PATH`, `GAPSCOPE_SOCKET` naming an abstract socket it
//! listens on), decodes every frame each connecting process sends, and
//! writes a JSON summary of what arrived: the hello, the notes, records per
//! kind, the kernels' first start and last end (and every kernel's span with
//! `--kernels`), drops and losses, whether the stream ended with Goodbye,
//! and frames or records of kinds this program does not know by name.
//!
//! No eBPF, no root: it checks the CUPTI path on machines where gapscope
//! itself cannot record (a container without CAP_BPF or BTF).
//!
//! ```text
//! gs-shim-listen [--shim PATH] [--out FILE] [--kernels] [--timeout SECS]
//!                [--grace SECS] -- CMD [ARGS...]
//! ```
//!
//! Exits with CMD's exit code (128+N when killed by signal N, 124 when
//! `--timeout` passed); the summary is written in every case.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gapscope_wire::{Frame, GpuRecord};
use serde_json::{json, Value};

const PROG: &str = "gs-shim-listen";
/// Distinct names kept per map (marker names, kernel names, examples).
const MAX_NAMES: usize = 200;
/// Debug texts kept of records of unknown kinds.
const MAX_EXAMPLES: usize = 20;
/// Debug texts kept of frames of unknown kinds (they are few: a blind span
/// is two frames).
const MAX_FRAME_TEXTS: usize = 200;

fn die(msg: &str) -> ! {
    eprintln!("{PROG}: {msg}");
    std::process::exit(2);
}

struct Options {
    shim: PathBuf,
    out: Option<PathBuf>,
    kernels: bool,
    timeout: Option<Duration>,
    grace: Duration,
    cmd: Vec<String>,
}

fn parse_args() -> Options {
    let mut args = std::env::args().skip(1);
    let mut shim = None;
    let mut out = None;
    let mut kernels = false;
    let mut timeout = None;
    let mut grace = Duration::from_secs(10);
    let secs = |v: Option<String>, what: &str| -> Duration {
        v.and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s >= 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or_else(|| die(&format!("{what} needs a number of seconds")))
    };
    loop {
        let Some(a) = args.next() else {
            die("no command: gs-shim-listen [--shim PATH] [--out FILE] [--kernels] [--timeout SECS] [--grace SECS] -- CMD [ARGS...]")
        };
        match a.as_str() {
            "--" => break,
            "--shim" => {
                shim = Some(PathBuf::from(
                    args.next().unwrap_or_else(|| die("--shim needs a path")),
                ))
            }
            "--out" => {
                out = Some(PathBuf::from(
                    args.next().unwrap_or_else(|| die("--out needs a path")),
                ))
            }
            "--kernels" => kernels = true,
            "--timeout" => timeout = Some(secs(args.next(), "--timeout")),
            "--grace" => grace = secs(args.next(), "--grace"),
            "-h" | "--help" => {
                println!("usage: {PROG} [--shim PATH] [--out FILE] [--kernels] [--timeout SECS] [--grace SECS] -- CMD [ARGS...]");
                std::process::exit(0);
            }
            other => die(&format!(
                "unexpected argument {other:?} (the command goes after --)"
            )),
        }
    }
    let cmd: Vec<String> = args.collect();
    if cmd.is_empty() {
        die("no command after --");
    }
    let shim = shim.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join(gapscope_wire::LIBRARY_NAME)))
            .unwrap_or_else(|| die("cannot find my own directory; pass --shim"))
    });
    if !shim.is_file() {
        die(&format!("no shim at {} (pass --shim)", shim.display()));
    }
    let shim = shim.canonicalize().unwrap_or(shim);
    Options {
        shim,
        out,
        kernels,
        timeout,
        grace,
        cmd,
    }
}

/// The variant name at the head of a Debug text: `Lost { .. }` → `Lost`.
fn variant_name(debug: &str) -> String {
    debug
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("?")
        .to_string()
}

fn bump(map: &mut BTreeMap<String, u64>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n += 1;
    } else if map.len() < MAX_NAMES {
        map.insert(key.to_string(), 1);
    } else {
        *map.entry("(other names)".to_string()).or_default() += 1;
    }
}

/// Cuts a text to at most `n` bytes on a char boundary.
fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut i = n;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    format!("{}…", &s[..i])
}

/// Every string field named `name` in a serialized record.
fn names_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match v {
                    Value::String(s) if k == "name" => out.push(s.clone()),
                    _ => names_in(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| names_in(v, out)),
        _ => {}
    }
}

/// What one connection delivered.
#[derive(Default)]
struct Conn {
    hello: Option<Value>,
    infos: Vec<String>,
    records: BTreeMap<String, u64>,
    frames: BTreeMap<String, u64>,
    kernels: u64,
    kernel_ns: u64,
    first_kernel_start: Option<u64>,
    last_kernel_end: Option<u64>,
    /// Kernels with a zero start or an end before their start.
    bad_kernel_times: u64,
    spans: Vec<(u64, u64)>,
    kernel_names: BTreeMap<String, u64>,
    marker_names: BTreeMap<String, u64>,
    /// `name` fields of records of kinds not known here (new NVTX ranges).
    unknown_record_names: BTreeMap<String, u64>,
    unknown_frames: BTreeMap<String, u64>,
    unknown_records: BTreeMap<String, u64>,
    unknown_record_examples: Vec<String>,
    /// Per unknown record kind, the earliest `start`/`ts` and latest `end`.
    unknown_record_spans: BTreeMap<String, (u64, u64)>,
    /// Earliest and latest marker timestamps.
    marker_span: Option<(u64, u64)>,
    /// Each frame of an unknown kind, as Debug prints it, in arrival order.
    unknown_frame_texts: Vec<String>,
    /// The last cumulative Dropped frame.
    dropped: Option<(u64, u64)>,
    lost: Vec<(u64, u64, u64)>,
    goodbye: bool,
    eof: bool,
    bytes: u64,
    error: Option<String>,
}

impl Conn {
    fn record(&mut self, r: &GpuRecord, keep_spans: bool) {
        #[allow(unreachable_patterns)] // new kinds are on their way
        let kind = match r {
            GpuRecord::Kernel {
                start, end, name, ..
            } => {
                self.kernels += 1;
                if *start == 0 || end < start {
                    self.bad_kernel_times += 1;
                } else {
                    self.kernel_ns += end - start;
                }
                self.first_kernel_start =
                    Some(self.first_kernel_start.map_or(*start, |s| s.min(*start)));
                self.last_kernel_end = Some(self.last_kernel_end.map_or(*end, |e| e.max(*end)));
                if keep_spans {
                    self.spans.push((*start, *end));
                }
                bump(&mut self.kernel_names, &cut(name, 160));
                "Kernel"
            }
            GpuRecord::Memcpy { .. } => "Memcpy",
            GpuRecord::Memset { .. } => "Memset",
            GpuRecord::Sync { .. } => "Sync",
            GpuRecord::Api { .. } => "Api",
            GpuRecord::Marker { name, ts, .. } => {
                bump(&mut self.marker_names, &cut(name, 160));
                self.marker_span = Some(
                    self.marker_span
                        .map_or((*ts, *ts), |(a, b)| (a.min(*ts), b.max(*ts))),
                );
                "Marker"
            }
            GpuRecord::Device { .. } => "Device",
            GpuRecord::DeviceUuid { .. } => "DeviceUuid",
            other => {
                let debug = format!("{other:?}");
                let kind = variant_name(&debug);
                *self.unknown_records.entry(kind.clone()).or_default() += 1;
                if let Ok(v) = serde_json::to_value(other) {
                    let mut names = Vec::new();
                    names_in(&v, &mut names);
                    for n in names {
                        bump(&mut self.unknown_record_names, &cut(&n, 160));
                    }
                    // Externally tagged: {"Kind": {fields}}.
                    let fields = v.as_object().and_then(|m| m.values().next());
                    let num = |k: &str| fields.and_then(|f| f[k].as_u64());
                    if let Some(start) = num("start").or_else(|| num("ts")) {
                        let end = num("end").unwrap_or(start);
                        let e = self
                            .unknown_record_spans
                            .entry(kind.clone())
                            .or_insert((start, end));
                        *e = (e.0.min(start), e.1.max(end));
                    }
                }
                if self.unknown_record_examples.len() < MAX_EXAMPLES {
                    self.unknown_record_examples.push(cut(&debug, 400));
                }
                *self.records.entry(kind).or_default() += 1;
                return;
            }
        };
        *self.records.entry(kind.to_string()).or_default() += 1;
    }

    fn frame(&mut self, f: Frame, keep_spans: bool) {
        #[allow(unreachable_patterns)] // new frames are on their way
        let kind = match f {
            Frame::Hello(h) => {
                self.hello = Some(serde_json::to_value(&h).unwrap_or(Value::Null));
                "Hello"
            }
            Frame::Records(rs) => {
                for r in &rs {
                    self.record(r, keep_spans);
                }
                "Records"
            }
            Frame::Dropped { cupti, shim, .. } => {
                self.dropped = Some((cupti, shim));
                "Dropped"
            }
            Frame::Lost {
                start,
                end,
                records,
                ..
            } => {
                self.lost.push((start, end, records));
                "Lost"
            }
            Frame::Info(s) => {
                self.infos.push(s);
                "Info"
            }
            Frame::Goodbye => {
                self.goodbye = true;
                "Goodbye"
            }
            other => {
                let debug = format!("{other:?}");
                let kind = variant_name(&debug);
                *self.unknown_frames.entry(kind.clone()).or_default() += 1;
                if self.unknown_frame_texts.len() < MAX_FRAME_TEXTS {
                    self.unknown_frame_texts.push(cut(&debug, 1000));
                }
                *self.frames.entry(kind).or_default() += 1;
                return;
            }
        };
        *self.frames.entry(kind.to_string()).or_default() += 1;
    }

    fn to_json(&self, keep_spans: bool) -> Value {
        let mut v = json!({
            "hello": self.hello,
            "infos": self.infos,
            "frames": self.frames,
            "records": self.records,
            "kernels": self.kernels,
            "kernel_ns": self.kernel_ns,
            "bad_kernel_times": self.bad_kernel_times,
            "first_kernel_start": self.first_kernel_start,
            "last_kernel_end": self.last_kernel_end,
            "kernel_names": self.kernel_names,
            "marker_names": self.marker_names,
            "unknown_frames": self.unknown_frames,
            "unknown_records": self.unknown_records,
            "unknown_record_names": self.unknown_record_names,
            "unknown_record_examples": self.unknown_record_examples,
            "unknown_frame_texts": self.unknown_frame_texts,
            "unknown_record_spans": self.unknown_record_spans.iter().map(|(k, &(a, b))| (k.clone(), json!({"first": a, "last": b}))).collect::<serde_json::Map<_, _>>(),
            "marker_span": self.marker_span.map(|(a, b)| json!({"first": a, "last": b})),
            "dropped": self.dropped.map(|(cupti, shim)| json!({"cupti": cupti, "shim": shim})),
            "lost": self.lost.iter().map(|&(start, end, records)| json!({"start": start, "end": end, "records": records})).collect::<Vec<_>>(),
            "goodbye": self.goodbye,
            "eof": self.eof,
            "bytes": self.bytes,
            "error": self.error,
        });
        if keep_spans {
            v["kernel_spans"] = json!(self.spans);
        }
        v
    }
}

/// A connection and the thread reading it.
type Reader = (Arc<Mutex<Conn>>, std::thread::JoinHandle<()>);

/// Reads one connection to its end (or until `stop`), frame by frame.
fn serve(mut s: UnixStream, conn: Arc<Mutex<Conn>>, stop: Arc<AtomicBool>, keep_spans: bool) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut dec = gapscope_wire::Decoder::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                conn.lock().unwrap().eof = true;
                return;
            }
            Ok(n) => {
                dec.push(&buf[..n]);
                let mut c = conn.lock().unwrap();
                c.bytes += n as u64;
                loop {
                    match dec.next_frame() {
                        Ok(Some(f)) => c.frame(f, keep_spans),
                        Ok(None) => break,
                        Err(e) => {
                            // The stream is unusable past an error.
                            c.error = Some(e.to_string());
                            return;
                        }
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
            Err(e) => {
                conn.lock().unwrap().error = Some(format!("read: {e}"));
                return;
            }
        }
    }
}

/// The sum over connections of a few fields, for readers that do not care
/// which process sent what.
fn totals(conns: &[Value]) -> Value {
    let sum = |k: &str| conns.iter().filter_map(|c| c[k].as_u64()).sum::<u64>();
    let first = conns
        .iter()
        .filter_map(|c| c["first_kernel_start"].as_u64())
        .min();
    let last = conns
        .iter()
        .filter_map(|c| c["last_kernel_end"].as_u64())
        .max();
    let mut records: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown: BTreeMap<String, u64> = BTreeMap::new();
    for c in conns {
        for (field, map) in [("records", &mut records), ("unknown_frames", &mut unknown)] {
            if let Some(m) = c[field].as_object() {
                for (k, v) in m {
                    *map.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
        }
    }
    let dropped = |k: &str| {
        conns
            .iter()
            .filter_map(|c| c["dropped"][k].as_u64())
            .sum::<u64>()
    };
    json!({
        "kernels": sum("kernels"),
        "kernel_ns": sum("kernel_ns"),
        "bad_kernel_times": sum("bad_kernel_times"),
        "first_kernel_start": first,
        "last_kernel_end": last,
        "records": records,
        "unknown_frames": unknown,
        "dropped_cupti": dropped("cupti"),
        "dropped_shim": dropped("shim"),
        "lost_records": conns.iter().flat_map(|c| c["lost"].as_array().cloned().unwrap_or_default())
            .filter_map(|l| l["records"].as_u64()).sum::<u64>(),
        "hellos": conns.iter().filter(|c| !c["hello"].is_null()).count(),
        "goodbyes": conns.iter().filter(|c| c["goodbye"] == true).count(),
        "infos": conns.iter().flat_map(|c| c["infos"].as_array().cloned().unwrap_or_default()).collect::<Vec<_>>(),
    })
}

fn main() {
    let o = parse_args();
    let name = format!(
        "gs-shim-listen.{}.{}",
        std::process::id(),
        gapscope_wire::clock::monotonic_ns()
    );
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .unwrap_or_else(|e| die(&format!("socket name: {e}")));
    let listener = UnixListener::bind_addr(&addr)
        .unwrap_or_else(|e| die(&format!("cannot bind @{name}: {e}")));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| die(&format!("socket: {e}")));

    let stop_accepting = Arc::new(AtomicBool::new(false));
    let stop_reading = Arc::new(AtomicBool::new(false));
    let conns: Arc<Mutex<Vec<Reader>>> = Arc::default();
    let acceptor = {
        let (stop_accepting, stop_reading, conns) =
            (stop_accepting.clone(), stop_reading.clone(), conns.clone());
        let keep = o.kernels;
        std::thread::spawn(move || loop {
            match listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let conn = Arc::new(Mutex::new(Conn::default()));
                    let (c, stop) = (conn.clone(), stop_reading.clone());
                    let h = std::thread::spawn(move || serve(s, c, stop, keep));
                    conns.lock().unwrap().push((conn, h));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if stop_accepting.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    eprintln!("{PROG}: accept: {e}");
                    return;
                }
            }
        })
    };

    let mut cmd = Command::new(&o.cmd[0]);
    cmd.args(&o.cmd[1..])
        .env("CUDA_INJECTION64_PATH", &o.shim)
        .env("NVTX_INJECTION64_PATH", &o.shim)
        .env("GAPSCOPE_SOCKET", format!("@{name}"));
    let overridden: Vec<String> = ["CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    let t0 = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => die(&format!("cannot run {}: {e}", o.cmd[0])),
    };
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(e) => {
                eprintln!("{PROG}: waiting for the command: {e}");
                break None;
            }
        }
        if o.timeout.is_some_and(|t| t0.elapsed() > t) {
            timed_out = true;
            // SAFETY: signalling our own child, by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let grace = Instant::now();
            while grace.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall_ns = t0.elapsed().as_nanos() as u64;

    // The streams end when the processes holding them do (forked children
    // may hold them a little longer): wait for every EOF, within the grace.
    let deadline = Instant::now() + o.grace;
    loop {
        let all_done = conns.lock().unwrap().iter().all(|(_, h)| h.is_finished());
        if all_done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_accepting.store(true, Ordering::Relaxed);
    let _ = acceptor.join();
    stop_reading.store(true, Ordering::Relaxed);
    let conns: Vec<_> = std::mem::take(&mut *conns.lock().unwrap());
    let conns: Vec<Value> = conns
        .into_iter()
        .map(|(c, h)| {
            let _ = h.join();
            let c = c.lock().unwrap();
            c.to_json(o.kernels)
        })
        .collect();

    let (code, signal) = match status {
        Some(s) => (s.code(), s.signal()),
        None => (None, None),
    };
    let summary = json!({
        "command": o.cmd,
        "shim": o.shim,
        "socket": format!("@{name}"),
        "overridden_env": overridden,
        "exit_code": code,
        "signal": signal,
        "timed_out": timed_out,
        "wall_ns": wall_ns,
        "totals": totals(&conns),
        "connections": conns,
    });
    let text = serde_json::to_string_pretty(&summary).expect("json");
    match &o.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, text + "\n") {
                eprintln!("{PROG}: cannot write {}: {e}", path.display());
                std::process::exit(1);
            }
        }
        None => println!("{text}"),
    }
    let rc = if timed_out {
        124
    } else {
        match (code, signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            _ => 1,
        }
    };
    std::process::exit(rc);
}
