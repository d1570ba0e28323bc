//! gs-workload: CPU-side workloads with known behaviour, for gapscope's tests
//! and demo. Each does real work (real files, pipes, sockets, processes) and
//! appends its own ground truth as JSON lines to `--truth FILE`: which
//! thread did what, for how long, and what the kernel's own accounting
//! (/proc/<pid>/task/<tid>/schedstat) says about it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gapscope_wire::clock::monotonic_ns;
use gapscope_wire::clock::thread_cpu_ns;
use serde_json::{json, Value};

const USAGE: &str = "\
gs-workload: workloads with known behaviour, for gapscope's tests and demo

usage: gs-workload COMMAND [--truth FILE] [options]

commands:
  spin     --ms N                      spin on one CPU for N ms of CPU time
  oread    --mib N --dir D             read an N MiB file with O_DIRECT in one thread
  waits    --ms N                      five threads blocked N ms each: futex, pipe,
                                       loopback TCP recv, accept on a Unix socket,
                                       nanosleep
  tree     --workers N --dir D --mib M --ms S
                                       fork N worker processes that read M MiB and
                                       spin S ms each; worker 0 execs a grandchild
  hold     --secs N --dir D            a parent and a child that read and compute
                                       for N seconds (a target for attach)
  fake-gpu --kernels N --kernel-us K --gap-us G [--uuid U]
                                       SIMULATED: speaks gapscope's GPU protocol on
                                       GAPSCOPE_SOCKET, reporting N kernels of K µs
                                       with G µs gaps on Simulated GPU 0 (whose
                                       UUID is U, when given)
  fake-cuda --lib PATH                 calls a stand-in libcuda (libfakecuda.so) with
                                       known durations: 50 launches of 200 µs, 5 nested
                                       launches of 1 ms, 4 syncs of 25 ms, 3 copies of 2 ms
  crash    --how segv|abort --ms N      read and compute for N ms, then crash for
                                       real (a null write, or abort()); no core file
  forks    --children N --dir D        fork N children at once, each reading a
                                       small file and exiting; wait for them all
  reuse                                a child that spins 100 ms and exits, then
                                       (as root) a second child given the same
                                       pid through ns_last_pid, which sleeps 200 ms
  busy     --messages N --pace-us P [--dlopen LIB] [--until stdin]
                                       threads busy in syscalls (a pipe of N numbered
                                       messages every P µs, reads of /dev/zero) under
                                       a 1 ms timer signal with a handler; prints what
                                       depends only on N (a target for injection);
                                       --until stdin: messages until a stdin line
  pipeline --workers N --steps K --dir D [--decode-ms 60] [--step-ms 15]
                                       demo: worker processes read and decode
                                       batches and hand them over pipes to a
                                       consumer that computes on them

Ground truth is appended to --truth FILE as one JSON object per line.";

mod args;
use args::Args;

fn die(msg: &str) -> ! {
    args::die("gs-workload", msg)
}

fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn pid() -> u32 {
    std::process::id()
}

/// The kernel's own account of this thread: (on-CPU ns, runqueue wait ns),
/// the first two fields of /proc/self/task/<tid>/schedstat.
fn schedstat() -> (u64, u64) {
    let text =
        std::fs::read_to_string(format!("/proc/self/task/{}/schedstat", tid())).unwrap_or_default();
    let mut f = text.split_whitespace().map(|v| v.parse().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}

fn schedstat_ns() -> u64 {
    schedstat().0
}

/// The kernel's count of the bytes this thread made storage read for it
/// (`read_bytes` of /proc/thread-self/io): its data, and any block the
/// kernel read on its behalf (a file system's metadata, its code paged in).
fn storage_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/thread-self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Appends one line of ground truth; one write() so processes can share a file.
fn truth(path: Option<&str>, mut v: Value) {
    let Some(path) = path else { return };
    v["pid"] = json!(pid());
    if v.get("tid").is_none() {
        v["tid"] = json!(tid());
    }
    let mut line = v.to_string();
    line.push('\n');
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| die(&format!("{path}: {e}")));
    f.write_all(line.as_bytes())
        .unwrap_or_else(|e| die(&format!("{path}: {e}")));
}

/// Burns CPU until this thread has used `ms` of CPU time.
fn spin_cpu(ms: u64) -> u64 {
    let target = thread_cpu_ns() + ms * 1_000_000;
    let mut x: u64 = 0x9e3779b97f4a7c15;
    while thread_cpu_ns() < target {
        for _ in 0..100_000 {
            x = x.rotate_left(7).wrapping_mul(0x100000001b3) ^ 0x5bd1e995;
        }
        std::hint::black_box(x);
    }
    x
}

/// A CPU-heavy "decode" of a buffer: checksum passes over it until this
/// thread has spent `ms` of CPU time (so it costs the same in any build).
fn decode(buf: &[u8], ms: u64) -> u64 {
    let target = thread_cpu_ns() + ms * 1_000_000;
    let mut h: u64 = 0xcbf29ce484222325;
    loop {
        for chunk in buf.chunks(256 << 10) {
            for w in chunk.chunks_exact(8) {
                h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x100000001b3);
            }
            if thread_cpu_ns() >= target {
                return std::hint::black_box(h);
            }
        }
    }
}

fn create_file(path: &Path, mib: u64) {
    let mut f = File::create(path).unwrap_or_else(|e| die(&format!("{}: {e}", path.display())));
    let block: Vec<u8> = (0..1 << 20).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..mib {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

/// A heap buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn cmd_spin(a: &Args) {
    let ms = a.num("ms", 300);
    spin_cpu(ms);
    let (on_cpu, run_delay) = schedstat();
    truth(
        a.get("truth"),
        json!({"role": a.get("role").unwrap_or("spin"), "schedstat_ns": on_cpu,
               "run_delay_ns": run_delay}),
    );
}

/// Reads every file this process maps (its binary, its libraries) into the
/// page cache. The kernel charges a thread's page faults on code not yet
/// in memory to its storage reads: on a machine busy enough to have
/// evicted them, a reader thread's first calls would add their pages to
/// the bytes it read from the disk.
fn warm_mapped_files() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut paths: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    paths.sort_unstable();
    paths.dedup();
    let mut buf = vec![0u8; 1 << 20];
    for p in paths {
        if let Ok(mut f) = File::open(p) {
            while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
        }
    }
}

fn cmd_oread(a: &Args) {
    let mib = a.num("mib", 64);
    let path = a.dir().join(format!("gs-oread-{}.dat", pid()));
    create_file(&path, mib);
    warm_mapped_files();
    let truth_path = a.get("truth").map(str::to_string);
    // The reads happen in a thread of their own, so its account holds them alone.
    let p = path.clone();
    let reader = std::thread::spawn(move || {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .unwrap_or_else(|e| die(&format!("O_DIRECT open of {}: {e}", p.display())));
        let mut buf = Aligned::new(1 << 20);
        let mut total = 0u64;
        loop {
            let n = f
                .read(buf.as_mut())
                .unwrap_or_else(|e| die(&format!("read: {e}")));
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let mut v = json!({"role": "oread", "bytes": total, "schedstat_ns": schedstat_ns()});
        // Read last, with the line built: what remains (the write) reads
        // nothing from storage, its code in the page cache already.
        v["storage_read_bytes"] = json!(storage_read_bytes());
        truth(truth_path.as_deref(), v);
    });
    reader.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

fn cmd_waits(a: &Args) {
    let ms = a.num("ms", 300);
    let dur = Duration::from_millis(ms);
    let t = a.get("truth").map(str::to_string);
    let report = move |t: &Option<String>, kind: &str, start: Instant| {
        truth(
            t.as_deref(),
            json!({"role": "wait", "kind": kind, "arranged_ns": ms * 1_000_000,
                   "measured_ns": start.elapsed().as_nanos() as u64}),
        );
    };
    let mut threads = Vec::new();

    // futex: wait on a condvar that a helper signals after `dur`.
    let t1 = t.clone();
    threads.push(std::thread::spawn(move || {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p2 = pair.clone();
        let start = Instant::now();
        let helper = std::thread::spawn(move || {
            std::thread::sleep(dur);
            *p2.0.lock().unwrap() = true;
            p2.1.notify_one();
        });
        let mut ready = pair.0.lock().unwrap();
        while !*ready {
            ready = pair.1.wait(ready).unwrap();
        }
        drop(ready);
        report(&t1, "ipc-futex", start);
        helper.join().unwrap();
    }));

    // pipe: block in read() until a helper writes after `dur`.
    let t2 = t.clone();
    threads.push(std::thread::spawn(move || {
        let mut fds = [0; 2];
        // SAFETY: fds is a 2-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (r, w) = (fds[0], fds[1]);
        let start = Instant::now();
        let helper = std::thread::spawn(move || {
            std::thread::sleep(dur);
            // SAFETY: writing one byte to our pipe.
            unsafe { libc::write(w, b"x".as_ptr() as *const _, 1) };
        });
        let mut byte = 0u8;
        // SAFETY: reading one byte into a live buffer.
        unsafe { libc::read(r, &mut byte as *mut u8 as *mut _, 1) };
        report(&t2, "ipc-pipe", start);
        helper.join().unwrap();
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }));

    // net: block in recv() on a loopback TCP socket until the peer sends.
    let t3 = t.clone();
    threads.push(std::thread::spawn(move || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let helper = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            std::thread::sleep(dur);
            conn.write_all(b"batch").unwrap();
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        report(&t3, "net", start);
        helper.join().unwrap();
    }));

    // ipc: block in accept() on a Unix listening socket until a peer
    // connects (a DataLoader worker's resource-sharer thread does this).
    let t5 = t.clone();
    threads.push(std::thread::spawn(move || {
        let path = std::env::temp_dir().join(format!("gs-waits-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let p2 = path.clone();
        let helper = std::thread::spawn(move || {
            std::thread::sleep(dur);
            std::os::unix::net::UnixStream::connect(&p2).unwrap()
        });
        let start = Instant::now();
        let _conn = listener.accept().unwrap();
        report(&t5, "ipc-accept", start);
        drop(helper.join().unwrap());
        let _ = std::fs::remove_file(&path);
    }));

    // sleep
    let t4 = t.clone();
    threads.push(std::thread::spawn(move || {
        let start = Instant::now();
        std::thread::sleep(dur);
        report(&t4, "sleep", start);
    }));

    for th in threads {
        th.join().unwrap();
    }
}

fn fork_or_die() -> i32 {
    // SAFETY: the workload is single-threaded when it forks.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    child
}

fn wait_children(children: &[i32]) -> bool {
    let mut ok = true;
    for &c in children {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(c, &mut status, 0) };
        ok &= libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    }
    ok
}

fn cmd_tree(a: &Args) {
    let workers = a.num("workers", 4);
    let mib = a.num("mib", 16);
    let ms = a.num("ms", 300);
    let dir = a.dir();
    let data = dir.join(format!("gs-tree-{}.dat", pid()));
    create_file(&data, mib);
    let truth_path = a.get("truth").map(str::to_string);
    let mut children = Vec::new();
    for w in 0..workers {
        let child = fork_or_die();
        if child == 0 {
            let mut grandchild = None;
            if w == 0 {
                // An exec'd grandchild: the tree must be followed through exec.
                let exe = std::env::current_exe().unwrap();
                let mut cmd = std::process::Command::new(exe);
                cmd.args(["spin", "--ms", "100", "--role", "grandchild"]);
                if let Some(t) = &truth_path {
                    cmd.args(["--truth", t]);
                }
                grandchild = Some(cmd.spawn().unwrap());
            }
            let mut f = File::open(&data).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut bytes = 0u64;
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                bytes += n as u64;
            }
            spin_cpu(ms);
            if let Some(mut g) = grandchild {
                g.wait().unwrap();
            }
            let (on_cpu, run_delay) = schedstat();
            truth(
                truth_path.as_deref(),
                json!({"role": "worker", "index": w, "bytes": bytes,
                       "schedstat_ns": on_cpu, "run_delay_ns": run_delay}),
            );
            std::process::exit(0);
        }
        children.push(child);
    }
    let ok = wait_children(&children);
    let _ = std::fs::remove_file(&data);
    truth(
        truth_path.as_deref(),
        json!({"role": "parent", "workers": children}),
    );
    if !ok {
        die("a worker failed");
    }
}

fn cmd_hold(a: &Args) {
    let secs = a.num("secs", 5);
    let dir = a.dir();
    let data = dir.join(format!("gs-hold-{}.dat", pid()));
    create_file(&data, 4);
    let until = Instant::now() + Duration::from_secs(secs);
    let work = |role: &str| {
        let mut buf = vec![0u8; 1 << 20];
        while Instant::now() < until {
            let mut f = File::open(&data).unwrap();
            while f.read(&mut buf).unwrap() > 0 {}
            decode(&buf, 5);
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = role;
    };
    let child = fork_or_die();
    if child == 0 {
        work("child");
        std::process::exit(0);
    }
    truth(
        a.get("truth"),
        json!({"role": "hold", "child": child, "secs": secs}),
    );
    work("parent");
    wait_children(&[child]);
    let _ = std::fs::remove_file(&data);
}

/// SIGALRM ticks counted by the handler of `busy`.
static TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_tick(_: libc::c_int) {
    TICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// A target for injection tests: a thread hands numbered messages over a
/// pipe to another, a third reads /dev/zero in a loop, a timer signal ticks
/// every millisecond into a handler, and the main thread waits on them.
/// What it prints depends only on its arguments, so a run that was
/// injected (or attached to) must print what a bare run prints; any error a
/// syscall returns (EINTR included: the handler restarts calls) is fatal.
fn cmd_busy(a: &Args) {
    let messages = a.num("messages", 4000);
    let pace_us = a.num("pace-us", 500);
    // A library to have mapped, as a GPU process has libcuda and libcupti.
    if let Some(lib) = a.get("dlopen") {
        let c = std::ffi::CString::new(lib).unwrap_or_else(|_| die("--dlopen: a NUL in the path"));
        // SAFETY: loading a library whose constructors are harmless (the
        // stand-in libcupti).
        if unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) }.is_null() {
            die(&format!("dlopen {lib} failed"));
        }
    }
    // SAFETY: installing a handler that only increments an atomic, and a
    // process timer; both documented uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_tick as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let tick = libc::timeval {
            tv_sec: 0,
            tv_usec: 1000,
        };
        let it = libc::itimerval {
            it_interval: tick,
            it_value: tick,
        };
        libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut());
    }
    let mut fds = [0; 2];
    // SAFETY: pipe fills the array it is given.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die("pipe");
    }
    // SAFETY: each end is owned by one File from here on.
    let (mut rx, mut tx) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // --until stdin: send until a line arrives on stdin, then as many as
    // sent (the sum still checks every message).
    let until_stdin = a.get("until") == Some("stdin");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_w = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut i = 0u64;
        while if until_stdin {
            !stop_w.load(std::sync::atomic::Ordering::Relaxed)
        } else {
            i < messages
        } {
            tx.write_all(&i.to_le_bytes())
                .unwrap_or_else(|e| die(&format!("pipe write: {e}")));
            std::thread::sleep(Duration::from_micros(pace_us));
            i += 1;
        }
        // Closing the pipe tells the reader how many there were.
    });
    let reader = std::thread::spawn(move || {
        let (mut sum, mut n) = (0u64, 0u64);
        let mut b = [0u8; 8];
        loop {
            match rx.read_exact(&mut b) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => die(&format!("pipe read: {e}")),
            }
            let v = u64::from_le_bytes(b);
            if v != n {
                die(&format!("message {n} arrived as {v}"));
            }
            sum = sum.wrapping_add(v.wrapping_mul(2654435761));
            n += 1;
        }
        (n, sum)
    });
    let zero_done = done.clone();
    let zeros = std::thread::spawn(move || {
        let mut f = File::open("/dev/zero").unwrap_or_else(|e| die(&format!("/dev/zero: {e}")));
        let mut b = vec![1u8; 4096];
        while !zero_done.load(std::sync::atomic::Ordering::Relaxed) {
            f.read_exact(&mut b)
                .unwrap_or_else(|e| die(&format!("/dev/zero read: {e}")));
            if b.iter().any(|&x| x != 0) {
                die("/dev/zero gave something else");
            }
        }
    });
    println!("ready {}", pid());
    let _ = std::io::stdout().flush();
    if until_stdin {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .unwrap_or_else(|e| die(&format!("stdin: {e}")));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    writer.join().unwrap();
    let (n, sum) = reader.join().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    zeros.join().unwrap();
    if TICKS.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        die("the timer never ticked");
    }
    println!("messages {n} sum {sum}");
}

fn cmd_pipeline(a: &Args) {
    let workers = a.num("workers", 2);
    let steps = a.num("steps", 20);
    let decode_ms = a.num("decode-ms", 60);
    let step_ms = a.num("step-ms", 15);
    let dir = a.dir();
    let data = dir.join(format!("gs-pipeline-{}.dat", pid()));
    println!(
        "gs-workload pipeline: {workers} loader processes read and decode batches from a \
         file and pass them over pipes to a consumer that computes on them ({steps} steps)"
    );
    create_file(&data, 32);
    let mut readers = Vec::new();
    let mut children = Vec::new();
    for w in 0..workers {
        let mut fds = [0; 2];
        // SAFETY: fds is a 2-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let child = fork_or_die();
        if child == 0 {
            unsafe { libc::close(fds[0]) };
            let mut f = File::open(&data).unwrap();
            let mut batch = vec![0u8; 2 << 20];
            for step in 0..steps {
                if step % workers != w {
                    continue;
                }
                if f.read(&mut batch).unwrap() < batch.len() {
                    f = File::open(&data).unwrap();
                    f.read_exact(&mut batch).unwrap();
                }
                let h = decode(&batch, decode_ms).to_le_bytes();
                // SAFETY: writing 8 bytes from a live buffer to our pipe.
                unsafe { libc::write(fds[1], h.as_ptr() as *const _, 8) };
            }
            std::process::exit(0);
        }
        unsafe { libc::close(fds[1]) };
        readers.push(fds[0]);
        children.push(child);
    }
    for step in 0..steps {
        let r = readers[(step % workers) as usize];
        let mut h = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from our pipe.
        unsafe { libc::read(r, h.as_mut_ptr() as *mut _, 8) };
        spin_cpu(step_ms); // the "training step"
    }
    wait_children(&children);
    let _ = std::fs::remove_file(&data);
    println!("gs-workload pipeline: done");
}

/// A simulated GPU: reports kernels it never ran, with exact timestamps, so
/// tests can check the GPU arithmetic end to end. Says so in its Hello.
fn cmd_fake_gpu(a: &Args) {
    use gapscope_wire::protocol::{encode, ClockMethod, Frame, Hello, VERSION};
    use gapscope_wire::GpuRecord;
    let n = a.num("kernels", 10);
    let k = a.num("kernel-us", 100) * 1_000;
    let g = a.num("gap-us", 50) * 1_000;
    let Ok(name) = std::env::var("GAPSCOPE_SOCKET") else {
        die("fake-gpu needs GAPSCOPE_SOCKET (run it under gapscope run)");
    };
    let mut conn = gapscope_wire::transport::connect(&name)
        .unwrap_or_else(|e| die(&format!("connect {name}: {e}")));
    let t0 = monotonic_ns() + 1_000_000;
    // The "launch calls", made now, on this thread, while it runs.
    let launched = monotonic_ns();
    let launches = (0..n).map(|i| GpuRecord::Api {
        domain: gapscope_wire::ApiDomain::Runtime,
        cbid: 211, // cudaLaunchKernel
        start: launched + i,
        end: launched + i + 1,
        pid: pid(),
        tid: tid(),
        correlation: i as u32,
    });
    // Which physical GPU its device 0 is, when told (as a shim says it).
    let uuid = a.get("uuid").map(|u| GpuRecord::DeviceUuid {
        id: 0,
        uuid: u.to_string(),
    });
    let records: Vec<GpuRecord> = std::iter::once(GpuRecord::Device {
        id: 0,
        name: "Simulated GPU 0".into(),
    })
    .chain(uuid)
    .chain(launches)
    .chain((0..n).map(|i| GpuRecord::Kernel {
        start: t0 + i * (k + g),
        end: t0 + i * (k + g) + k,
        device: 0,
        context: 1,
        stream: 7,
        correlation: i as u32,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        name: "simulated_kernel".into(),
    }))
    .collect();
    let end = t0 + n * (k + g);
    let mut bytes = Vec::new();
    encode(
        &Frame::Hello(Hello {
            version: VERSION,
            pid: pid(),
            driver_version: 0,
            cupti_version: 0,
            clock: ClockMethod::Native,
            source: "simulated device (gs-workload fake-gpu)".into(),
        }),
        &mut bytes,
    );
    encode(&Frame::Records(records), &mut bytes);
    conn.write_all(&bytes).unwrap();
    // Stay alive past the last simulated kernel, as a real job would.
    while monotonic_ns() < end + 1_000_000 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut bye = Vec::new();
    encode(&Frame::Goodbye, &mut bye);
    conn.write_all(&bye).unwrap();
    truth(
        a.get("truth"),
        json!({"role": "fake-gpu", "busy_ns": n * k, "gaps": n.saturating_sub(1), "gap_ns": g,
               "first_ns": t0, "last_ns": end - g}),
    );
}

/// Calls a stand-in libcuda with known durations (see examples/fakecuda).
fn cmd_fake_cuda(a: &Args) {
    use std::ffi::{c_void, CString};
    let lib = a
        .get("lib")
        .unwrap_or_else(|| die("fake-cuda needs --lib PATH"));
    let c = CString::new(lib).unwrap();
    type Launch = extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> i32;
    type LaunchEx =
        extern "C" fn(*const c_void, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> i32;
    type Sync = extern "C" fn(*mut c_void) -> i32;
    type Copy = extern "C" fn(u64, *const c_void, usize) -> i32;
    // SAFETY: loading the stand-in library and binding its documented symbols.
    let (launch, launch_ex, sync, copy) = unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
        if h.is_null() {
            die(&format!("cannot load {lib}"));
        }
        let sym = |name: &std::ffi::CStr| {
            let p = libc::dlsym(h, name.as_ptr());
            if p.is_null() {
                die(&format!("{lib} lacks {name:?}"));
            }
            p
        };
        (
            std::mem::transmute::<*mut c_void, Launch>(sym(c"cuLaunchKernel")),
            std::mem::transmute::<*mut c_void, LaunchEx>(sym(c"cuLaunchKernelEx")),
            std::mem::transmute::<*mut c_void, Sync>(sym(c"cuStreamSynchronize")),
            std::mem::transmute::<*mut c_void, Copy>(sym(c"cuMemcpyHtoD_v2")),
        )
    };
    std::thread::sleep(Duration::from_millis(a.num("delay-ms", 0)));
    let null = std::ptr::null_mut();
    let mut measured = std::collections::BTreeMap::<&str, (u64, u64)>::new();
    let mut timed = |name: &'static str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        let e = measured.entry(name).or_default();
        e.0 += 1;
        e.1 += t.elapsed().as_nanos() as u64;
    };
    for _ in 0..50 {
        timed("cuLaunchKernel", &mut || {
            launch(null, 200, 1, 1, 1, 1, 1, 0, null, null as _, null as _);
        });
    }
    for _ in 0..5 {
        timed("cuLaunchKernelEx", &mut || {
            launch_ex(std::ptr::null(), null, null as _, null as _);
        });
    }
    for _ in 0..4 {
        timed("cuStreamSynchronize", &mut || {
            sync(25_000 as *mut c_void);
        });
    }
    for _ in 0..3 {
        timed("cuMemcpyHtoD_v2", &mut || {
            copy(0, std::ptr::null(), 2_000_000);
        });
    }
    let calls: serde_json::Map<String, serde_json::Value> = measured
        .into_iter()
        .map(|(k, (n, ns))| (k.to_string(), json!({"count": n, "total_ns": ns})))
        .collect();
    truth(a.get("truth"), json!({"role": "fake-cuda", "calls": calls}));
}

fn cmd_crash(a: &Args) {
    // No core file: the test is about the exit status, not the dump.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    let mut buf = vec![0u8; 1 << 16];
    let mut f = File::open("/proc/self/maps").unwrap();
    let _ = f.read(&mut buf);
    spin_cpu(a.num("ms", 200));
    match a.get("how").unwrap_or("segv") {
        // SAFETY: none — the point is a real invalid write.
        "segv" => unsafe {
            std::ptr::write_volatile(std::ptr::null_mut::<u64>(), 1);
        },
        "abort" => std::process::abort(),
        other => die(&format!("--how: segv or abort, not {other}")),
    }
}

fn cmd_forks(a: &Args) {
    let n = a.num("children", 200);
    let dir = a.dir();
    let data = dir.join(format!("gs-forks-{}.dat", pid()));
    std::fs::write(&data, vec![7u8; 4096]).unwrap();
    let mut children = Vec::new();
    for _ in 0..n {
        let child = fork_or_die();
        if child == 0 {
            let mut buf = [0u8; 4096];
            let mut f = File::open(&data).unwrap();
            let got = f.read(&mut buf).unwrap();
            std::process::exit(if got == 4096 { 0 } else { 1 });
        }
        children.push(child);
    }
    let ok = wait_children(&children);
    let _ = std::fs::remove_file(&data);
    truth(
        a.get("truth"),
        json!({"role": "parent", "children": children}),
    );
    if !ok {
        die("a child failed");
    }
}

fn cmd_reuse(a: &Args) {
    let first = fork_or_die();
    if first == 0 {
        spin_cpu(100);
        std::process::exit(0);
    }
    wait_children(&[first]);
    // The next fork gets ns_last_pid + 1, if free: the pid just released.
    let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", first - 1));
    let second = fork_or_die();
    if second == 0 {
        std::thread::sleep(Duration::from_millis(200));
        std::process::exit(0);
    }
    wait_children(&[second]);
    truth(
        a.get("truth"),
        json!({"role": "parent", "first": first, "second": second}),
    );
}

fn main() {
    let args = Args::parse("gs-workload");
    match args.cmd.as_str() {
        "spin" => cmd_spin(&args),
        "oread" => cmd_oread(&args),
        "waits" => cmd_waits(&args),
        "tree" => cmd_tree(&args),
        "hold" => cmd_hold(&args),
        "pipeline" => cmd_pipeline(&args),
        "busy" => cmd_busy(&args),
        "fake-gpu" => cmd_fake_gpu(&args),
        "fake-cuda" => cmd_fake_cuda(&args),
        "crash" => cmd_crash(&args),
        "forks" => cmd_forks(&args),
        "reuse" => cmd_reuse(&args),
        "-h" | "--help" | "help" => println!("{USAGE}"),
        "" => die(&format!("missing command\n\n{USAGE}")),
        other => die(&format!("unknown command {other:?}\n\n{USAGE}")),
    }
}
