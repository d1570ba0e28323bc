//! simtrain: a SIMULATED training job with a known bottleneck.
//!
//! Everything on the host is real: data-loader worker processes read a
//! dataset file (O_DIRECT), decode on the CPU, or receive batches over
//! loopback TCP, and hand batches to the trainer over pipes; the trainer
//! spins for its host work and blocks in its waits. Only the GPU is
//! simulated: a *simulated device* schedules the trainer's kernels and
//! copies on CLOCK_MONOTONIC and reports them, with the CUDA API calls that
//! issued them, through gapscope's GPU wire protocol — the same code the
//! CUPTI shim uses. It says so in its handshake, so reports show
//! `source: "simulated"`.
//!
//! At the end it writes the ground truth: the simulated GPU's busy time and
//! its idle time split by the cause simtrain itself produced it with — the
//! trainer's own log of what it did, its wait for each batch split by what
//! the batch's loader reported doing meanwhile (fetching, computing, sent),
//! and the share of its host work the kernel did not charge it for (its
//! CPU clock: waiting for a CPU, or a CPU the hypervisor took) counted as
//! contention, so that the truth holds on a busy machine too.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod cpus;

use gapscope_wire::clock::monotonic_ns as now;
use gapscope_wire::clock::thread_cpu_ns as thread_cpu;
use gs_simgpu::{sleep_until, union_in_place, SimDevice};

const USAGE: &str = "\
simtrain: a SIMULATED training job (real data loading on the host, a simulated GPU)

usage: simtrain --bottleneck KIND [--fix CAUSE] [--workers N] [--steps N] [--seed N]
                [--data DIR] [--lose-gpu-step N] [--busy-loaders] [--loader-cpu C]
                --ground-truth PATH
       simtrain --prepare [--data DIR]

KIND: none, input-io, input-cpu, input-network, host-cpu, launch, sync, memory, mixed,
      mixed-network (mixed = input-io and sync; mixed-network = input-network, a
      slower server, and sync: its pace does not depend on this machine's storage)

--fix CAUSE: the same job with that cause's stalls taken out and everything else
equal, as the fix a report recommends would do (what a what-if replay predicts):
  input.io       the loaders' reads take no time (the data is at hand)
  input.cpu      the loaders' decoding takes no time (done ahead, elsewhere)
  input.network  the data server answers at once
  cpu.host       the trainer's own host work per step is gone (behind a
                 synchronize: the part that outlasted the GPU's work)
  cpu.launch     each step's kernels from one CUDA graph launch
  sync           no synchronize per step (the host work after it stays, now
                 beside the GPU's work: loss.item() every N steps)
  memory         copies from pinned memory: no staging, asynchronous

--lose-gpu-step N: the device drops step N's records and reports the span they
covered, as the CUPTI shim does when gapscope cannot keep up.

--busy-loaders: loaders that are ahead (fast input) keep their CPU busy while
they wait to make the next batch, as workers decoding ahead on other cores do,
instead of sleeping.

--loader-cpu C: the loaders run on CPU C only (the trainer where it was put).

Run it under `gapscope run` to see the diagnosis; the simulated device speaks to
gapscope through GAPSCOPE_SOCKET. Run on its own, the device waits dormant for
`gapscope attach` or the agent, and the ground truth covers the job from when
the first profiler connected.";

const DATASET_MIB: u64 = 256;
/// O_DIRECT read size: large reads keep the loader I/O-bound, not syscall-bound.
const BLOCK: usize = 1 << 20;

fn die(msg: &str) -> ! {
    eprintln!("simtrain: {msg}");
    std::process::exit(2);
}

/// Real CPU work: `ns` of this thread's CPU time.
fn burn(ns: u64) {
    let end = thread_cpu() + ns;
    let mut x = 0x9e3779b97f4a7c15u64;
    // The CPU clock is a syscall: checked every few thousand rounds, not
    // every one — yet often, since a burn overshoots by up to one chunk
    // (50 000 rounds were ~0.5 ms in the tests' unoptimized build: the
    // sync scenario's fixed host work, as long as the wait before it,
    // came out 0.7 ms a step longer, all of it idle).
    while thread_cpu() < end {
        for _ in 0..2_000 {
            x = x.rotate_left(5).wrapping_mul(0x100000001b3) ^ 0x5bd1e995;
        }
    }
    std::hint::black_box(x);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bottleneck {
    None,
    InputIo,
    InputCpu,
    InputNetwork,
    HostCpu,
    Launch,
    Sync,
    Memory,
    Mixed,
    MixedNetwork,
}

impl Bottleneck {
    fn parse(s: &str) -> Bottleneck {
        match s {
            "none" => Bottleneck::None,
            "input-io" => Bottleneck::InputIo,
            "input-cpu" => Bottleneck::InputCpu,
            "input-network" => Bottleneck::InputNetwork,
            "host-cpu" => Bottleneck::HostCpu,
            "launch" => Bottleneck::Launch,
            "sync" => Bottleneck::Sync,
            "memory" => Bottleneck::Memory,
            "mixed" => Bottleneck::Mixed,
            "mixed-network" => Bottleneck::MixedNetwork,
            other => die(&format!("unknown bottleneck {other:?}\n\n{USAGE}")),
        }
    }

    /// What the data loader does per batch.
    fn input(self) -> Input {
        match self {
            Bottleneck::InputIo | Bottleneck::Mixed => Input::Io,
            Bottleneck::InputCpu => Input::Cpu,
            Bottleneck::InputNetwork | Bottleneck::MixedNetwork => Input::Network,
            _ => Input::Fast,
        }
    }
}

/// A cause's stalls taken out (`--fix`), named as gapscope names causes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fix {
    InputIo,
    InputCpu,
    InputNetwork,
    Host,
    Launch,
    Sync,
    Memory,
}

impl Fix {
    fn parse(s: &str) -> Fix {
        match s {
            "input.io" => Fix::InputIo,
            "input.cpu" => Fix::InputCpu,
            "input.network" => Fix::InputNetwork,
            "cpu.host" => Fix::Host,
            "cpu.launch" => Fix::Launch,
            "sync" => Fix::Sync,
            "memory" => Fix::Memory,
            other => die(&format!("--fix: no such cause {other:?}\n\n{USAGE}")),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Input {
    Fast,
    Io,
    Cpu,
    Network,
}

impl Input {
    fn cause(self) -> &'static str {
        match self {
            Input::Io => "input.io",
            Input::Cpu => "input.cpu",
            Input::Network => "input.network",
            // Batches are ready ahead: any wait is a scheduling hiccup.
            Input::Fast => "cpu.contention",
        }
    }
}

/// Host time between two logged spans of one cause this short is theirs.
const MERGE_NS: u64 = 2_000;

/// What the trainer was doing when, by cause: the ground truth's source.
#[derive(Default)]
struct Log {
    /// (start, end, cause, of which the thread waited for a CPU).
    spans: Vec<(u64, u64, &'static str, u64)>,
}

impl Log {
    fn add(&mut self, a: u64, b: u64, cause: &'static str) {
        self.add_waiting(a, b, cause, 0);
    }

    /// A call of `cause` over `[a, b)` in which the thread waited `waited`
    /// for a CPU (preempted, or its CPU taken): that part is contention.
    fn add_waiting(&mut self, a: u64, b: u64, cause: &'static str, waited: u64) {
        if b <= a {
            return;
        }
        // Back-to-back spans of one cause are one (a launch loop's 300
        // launches a step; their waits for a CPU summed, spread over it):
        // the truth's bookkeeping at exit, inside the recorded run, must
        // not grow with the launches a fix takes away.
        match self.spans.last_mut() {
            Some(l) if l.2 == cause && a >= l.1 && a - l.1 < MERGE_NS => {
                l.1 = b;
                l.3 += waited;
            }
            _ => self.spans.push((a, b, cause, waited)),
        }
    }

    /// [`Log::add_waiting`], never merged with the span before it: its
    /// wait for a CPU stays inside it.
    fn add_apart(&mut self, a: u64, b: u64, cause: &'static str, waited: u64) {
        if b > a {
            self.spans.push((a, b, cause, waited));
        }
    }

    /// Host work of `cause`: the share of it the kernel did not charge this
    /// thread for (its CPU clock) goes to `cpu.contention` instead — time
    /// waiting for a CPU, and a CPU the hypervisor took from it (steal):
    /// on a busy machine that is what kept the GPU waiting. Where in the
    /// span it waited is not known: the wait is taken as spread evenly
    /// over it.
    fn cpu_work(&mut self, cause: &'static str, work: impl FnOnce()) {
        self.cpu_work_after_sync(0, cause, work);
    }

    /// Host work right after a synchronize that waited `hidden` ns for the
    /// GPU: that much of it is the synchronize's (had the host not waited,
    /// it would have run while the GPU worked: what overlap hides), the
    /// rest `cause`'s own. Its wait for a CPU is spread over both.
    fn cpu_work_after_sync(&mut self, hidden: u64, cause: &'static str, work: impl FnOnce()) {
        self.cpu_work_blocking(hidden, cause, || {
            work();
            0
        });
    }

    /// [`Log::cpu_work_after_sync`] for work that says how long of it the
    /// thread was blocked (gave up its CPU of its own accord: not a wait
    /// for one, the work's own time). Both ends read the wall clock, then
    /// the CPU clock: the reads' own cost cancels.
    fn cpu_work_blocking(&mut self, hidden: u64, cause: &'static str, work: impl FnOnce() -> u64) {
        let (a, cpu_before) = (now(), thread_cpu());
        let blocked = work();
        let (b, cpu_after) = (now(), thread_cpu());
        if b > a {
            let waited = (b - a)
                .saturating_sub(cpu_after - cpu_before)
                .saturating_sub(blocked);
            let cpu = (b - a - waited).max(1);
            // `hidden` of its CPU time, and its share of the wait.
            let own = hidden.min(cpu);
            let span = own + waited * own / cpu;
            let mid = a + span.min(b - a);
            if mid > a {
                self.spans.push((a, mid, "sync", waited * own / cpu));
            }
            if b > mid {
                self.spans
                    .push((mid, b, cause, waited - waited * own / cpu));
            }
        }
    }

    /// Idle time of the device in `[lo, hi)` split by what the trainer did;
    /// `union`: its busy spans, disjoint and in order. Beside it, of the
    /// `cpu.contention` there, how much fell inside each cause's own work
    /// (what taking that work away takes with it).
    #[allow(clippy::type_complexity)]
    fn idle_by_cause(
        &self,
        union: &[(u64, u64)],
        lo: u64,
        hi: u64,
    ) -> (BTreeMap<&'static str, u64>, BTreeMap<&'static str, u64>) {
        let mut out = BTreeMap::new();
        let Some(&(first, _)) = union.first() else {
            return (out, BTreeMap::new());
        };
        let last = union.last().unwrap().1;
        *out.entry("startup").or_default() += first - lo;
        *out.entry("teardown").or_default() += hi.saturating_sub(last);
        // Spans are logged in time order and never overlap: one sweep,
        // counted in a few locals (a map's entry per gap costs a launch-bound
        // run tens of ms at exit in a debug build, inside the recording).
        let mut sums: Vec<(&'static str, u64)> = Vec::new();
        let mut inside: Vec<(&'static str, u64)> = Vec::new();
        let mut bump = |c: &'static str, ns: u64| match sums.iter_mut().find(|x| x.0 == c) {
            Some(x) => x.1 += ns,
            None => sums.push((c, ns)),
        };
        let mut i = 0;
        for w in union.windows(2) {
            let (a, b) = (w[0].1, w[1].0);
            let mut covered = 0;
            while i < self.spans.len() && self.spans[i].1 <= a {
                i += 1;
            }
            let mut j = i;
            while j < self.spans.len() && self.spans[j].0 < b {
                let (s, e, c, waited) = self.spans[j];
                let len = e - s;
                let (s, e) = (s.max(a), e.min(b));
                if e > s {
                    let waiting = ((e - s) as u128 * waited as u128 / len as u128) as u64;
                    bump("cpu.contention", waiting);
                    bump(c, e - s - waiting);
                    if waiting > 0 {
                        match inside.iter_mut().find(|x| x.0 == c) {
                            Some(x) => x.1 += waiting,
                            None => inside.push((c, waiting)),
                        }
                    }
                    covered += e - s;
                }
                j += 1;
            }
            // The trainer's own bookkeeping between logged activities.
            bump("cpu.host", (b - a) - covered);
        }
        for (c, ns) in sums {
            *out.entry(c).or_default() += ns;
        }
        (out, inside.into_iter().collect())
    }
}

/// The trainer's wait `[a, b)` for a batch, by what was keeping it: its
/// loader fetching the data (`fetch`) — the input's own cause; the loader
/// computing, or waiting for a CPU to compute on — `input.cpu`; and after
/// the loader sent it (`sent`), the trainer itself waiting to run —
/// `cpu.contention`. With fast input the batch is ready ahead: any wait
/// for the loader is a scheduling hiccup. (Before, the whole wait went to
/// the input's cause: on a busy machine the loader's computing and the
/// trainer's own wait for a CPU were then counted as fetching.)
fn log_batch_wait(log: &mut Log, input: Input, (a, b): (u64, u64), fetch: (u64, u64), sent: u64) {
    let clip = |t: u64| t.clamp(a, b);
    let (fetched_from, fetched_to, sent) = (clip(fetch.0), clip(fetch.1), clip(sent));
    let (fetching, computing) = match input {
        Input::Fast => ("cpu.contention", "cpu.contention"),
        // Its data is read from the file before it is crunched.
        Input::Cpu => ("input.io", "input.cpu"),
        Input::Io | Input::Network => (input.cause(), "input.cpu"),
    };
    log.add(a, fetched_from, computing);
    log.add(fetched_from, fetched_to, fetching);
    log.add(fetched_to, sent, computing);
    log.add(sent, b, "cpu.contention");
}

// ---------------------------------------------------------- data loading

fn dataset_path(dir: &Path) -> PathBuf {
    dir.join("simtrain-dataset.bin")
}

/// The dataset: a file large enough that O_DIRECT reads go to the device.
fn prepare(dir: &Path) -> PathBuf {
    let path = dataset_path(dir);
    if path.metadata().map(|m| m.len()).unwrap_or(0) == DATASET_MIB << 20 {
        return path;
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
    let mut f = File::create(&path).unwrap_or_else(|e| die(&format!("{}: {e}", path.display())));
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    for _ in 0..DATASET_MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    path
}

/// What a loader sends per batch: its step, when it began and finished
/// fetching the batch's data, and when it sent it (CLOCK_MONOTONIC ns).
const BATCH_MSG: usize = 32;

/// Batches a fast loader makes before the trainer has taken any.
const PREFETCH: u64 = 2;

/// A fast loader's wait for the trainer to take a batch: asleep in a read,
/// or (`busy`) on its CPU, polling between 50 µs of work. False at the end.
fn wait_for_token(a: &mut File, busy: bool) -> bool {
    let mut token = [0u8];
    if !busy {
        return a.read_exact(&mut token).is_ok();
    }
    loop {
        let mut poll = libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own; a zero timeout never sleeps.
        if unsafe { libc::poll(&mut poll, 1, 0) } > 0 {
            return a.read_exact(&mut token).is_ok();
        }
        burn(50_000);
    }
}

/// A data-loader worker: produces batches `index, index + n, ...` into `out`.
#[allow(clippy::too_many_arguments)]
fn worker(
    index: u64,
    n: u64,
    steps: u64,
    input: Input,
    reads: u32,
    data: &Path,
    net: Option<u16>,
    out: File,
    seed: u64,
    fix: Option<Fix>,
    mut ahead: Option<File>,
    busy: bool,
) {
    let decode = |ns: u64| {
        if fix != Some(Fix::InputCpu) {
            burn(ns)
        }
    };
    let mut out = out;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(data)
        .unwrap_or_else(|e| die(&format!("O_DIRECT open {}: {e}", data.display())));
    let layout = std::alloc::Layout::from_size_align(BLOCK, BLOCK).unwrap();
    // SAFETY: non-zero layout; freed at process exit.
    let buf = unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc(layout), BLOCK) };
    let mut rng = seed ^ (index + 1).wrapping_mul(0x9e3779b97f4a7c15);
    let blocks = (DATASET_MIB << 20) / BLOCK as u64;
    let mut conn = net.map(|port| TcpStream::connect(("127.0.0.1", port)).unwrap());
    let mut step = index;
    let mut made = 0u64;
    while step < steps {
        if let Some(a) = ahead.as_mut().filter(|_| made >= PREFETCH) {
            if !wait_for_token(a, busy) {
                return;
            }
        }
        made += 1;
        // When this batch's data was being fetched: the trainer's ground
        // truth splits its wait by what its loader was doing.
        let fetch_start = now();
        let mut fetch_end = fetch_start;
        match input {
            Input::Io => {
                // Random 1 MiB reads that the page cache cannot serve.
                let reads = if fix == Some(Fix::InputIo) { 0 } else { reads };
                for _ in 0..reads {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (rng >> 20) % blocks * BLOCK as u64;
                    // SAFETY: pread into our aligned buffer.
                    unsafe {
                        libc::pread(
                            file.as_raw_fd(),
                            buf.as_mut_ptr() as *mut _,
                            BLOCK,
                            off as i64,
                        )
                    };
                }
                fetch_end = now();
                decode(50_000);
            }
            Input::Cpu => {
                if fix != Some(Fix::InputIo) {
                    let _ = file.read(buf);
                }
                fetch_end = now();
                decode(24_000_000);
            }
            Input::Network => {
                let mut batch = [0u8; 64 << 10];
                conn.as_mut().unwrap().read_exact(&mut batch).unwrap();
                fetch_end = now();
                decode(200_000);
            }
            Input::Fast => decode(300_000),
        }
        let mut msg = [0u8; BATCH_MSG];
        for (i, v) in [step, fetch_start, fetch_end, now()]
            .into_iter()
            .enumerate()
        {
            msg[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        if out.write_all(&msg).is_err() {
            return;
        }
        step += n;
    }
}

/// The "remote storage": serves 64 KiB batches with network-like latency.
/// `latency` per batch: none when the network is fixed (`--fix input.network`).
fn data_server(listener: TcpListener, clients: u64, latency: Option<Duration>) {
    let mut conns: Vec<TcpStream> = (0..clients).map(|_| listener.accept().unwrap().0).collect();
    let batch = vec![7u8; 64 << 10];
    let mut handles = Vec::new();
    for mut c in conns.drain(..) {
        let b = batch.clone();
        handles.push(std::thread::spawn(move || loop {
            if let Some(l) = latency {
                std::thread::sleep(l);
            }
            if c.write_all(&b).is_err() {
                return;
            }
        }));
    }
    for h in handles {
        let _ = h.join();
    }
}

fn fork_child(f: impl FnOnce()) -> i32 {
    // SAFETY: simtrain forks before starting any thread.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die("fork failed");
    }
    if pid == 0 {
        f();
        // SAFETY: leave without running the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    pid
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: fds is a 2-element array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die("pipe failed");
    }
    // SAFETY: both fds were just created.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

// --------------------------------------------------------------- trainer

struct Opts {
    bottleneck: Bottleneck,
    fix: Option<Fix>,
    workers: u64,
    steps: u64,
    seed: u64,
    data: PathBuf,
    truth: PathBuf,
    lose_gpu_step: Option<u64>,
    busy_loaders: bool,
    loader_cpu: Option<usize>,
}

fn parse() -> Option<Opts> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |k: &str, d: u64| {
        get(k).map_or(d, |v| {
            v.parse()
                .unwrap_or_else(|_| die(&format!("{k}: not a number: {v}")))
        })
    };
    let data = PathBuf::from(get("--data").unwrap_or_else(|| "/var/tmp/simtrain".into()));
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        std::process::exit(0);
    }
    if args.iter().any(|a| a == "--prepare") {
        let p = prepare(&data);
        println!("simtrain: dataset ready at {}", p.display());
        return None;
    }
    let bottleneck = Bottleneck::parse(
        &get("--bottleneck")
            .unwrap_or_else(|| die(&format!("--bottleneck is required\n\n{USAGE}"))),
    );
    Some(Opts {
        bottleneck,
        fix: get("--fix").map(|f| Fix::parse(&f)),
        workers: num("--workers", 2).max(1),
        steps: num("--steps", 60).max(1),
        seed: num("--seed", 1),
        lose_gpu_step: get("--lose-gpu-step").map(|_| num("--lose-gpu-step", 0)),
        busy_loaders: args.iter().any(|a| a == "--busy-loaders"),
        loader_cpu: get("--loader-cpu").map(|_| num("--loader-cpu", 0) as usize),
        data,
        truth: PathBuf::from(
            get("--ground-truth")
                .unwrap_or_else(|| die(&format!("--ground-truth is required\n\n{USAGE}"))),
        ),
    })
}

fn main() {
    let t_start = now();
    let Some(o) = parse() else { return };
    let data = prepare(&o.data);
    println!(
        "simtrain: SIMULATED GPU, real data loading — bottleneck {:?}{}, {} workers, {} steps",
        o.bottleneck,
        o.fix.map_or(String::new(), |f| format!(" (fixed: {f:?})")),
        o.workers,
        o.steps
    );
    let input = o.bottleneck.input();

    // Data loading processes: forked before any thread exists.
    let mut children = Vec::new();
    let port = (input == Input::Network).then(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients = o.workers;
        // mixed-network's server is slow enough for the input to set the
        // pace over its sync-bound trainer.
        let ms = if o.bottleneck == Bottleneck::MixedNetwork {
            60
        } else {
            30
        };
        let latency = (o.fix != Some(Fix::InputNetwork)).then(|| Duration::from_millis(ms));
        children.push(fork_child(move || data_server(listener, clients, latency)));
        port
    });
    // Random 1 MiB reads per batch: mixed makes the loader slower than its
    // sync-bound trainer too, so both causes show.
    let reads = if o.bottleneck == Bottleneck::Mixed {
        60
    } else {
        30
    };
    let mut readers = Vec::new();
    // Fast loaders run at most PREFETCH batches ahead, as a DataLoader's
    // workers do (prefetch_factor): unbounded, they made every batch in the
    // first ~50 ms and took the trainer's CPU meanwhile, a burst that moved
    // from run to run. Slow loaders are never that far ahead.
    let mut tokens: Vec<Option<File>> = Vec::new();
    for w in 0..o.workers {
        let (r, wr) = pipe();
        let (req_r, req_w) = if input == Input::Fast {
            let (a, b) = pipe();
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let (steps, n, seed, d, fix) = (o.steps, o.workers, o.seed, data.clone(), o.fix);
        let (busy, cpu) = (o.busy_loaders, o.loader_cpu);
        let (rfd, wfd) = (r.as_raw_fd(), wr.as_raw_fd());
        let req_wfd = req_w.as_ref().map(|f| f.as_raw_fd());
        children.push(fork_child(move || {
            if let Some(c) = cpu {
                if let Err(e) = cpus::pin_to(c) {
                    die(&format!("--loader-cpu {c}: {e}"));
                }
            }
            // SAFETY: in the child, this process's copies of the pipe ends.
            let out = unsafe {
                libc::close(rfd);
                if let Some(fd) = req_wfd {
                    libc::close(fd);
                }
                File::from_raw_fd(wfd)
            };
            worker(
                w, n, steps, input, reads, &d, port, out, seed, fix, req_r, busy,
            )
        }));
        drop(wr);
        readers.push(r);
        tokens.push(req_w);
    }

    let mut dev = SimDevice::connect("simtrain");
    // The fixes the device itself makes: launches that cost nothing
    // (`cpu.launch`), copies from pinned memory (`memory`).
    let launch_cost = |ns: u64| if o.fix == Some(Fix::Launch) { 0 } else { ns };
    let pinned = o.fix == Some(Fix::Memory);
    let mut log = Log::default();
    // Only the memory scenario copies: touching 192 MiB costs others a
    // start-up that moves by 100 ms from run to run on a busy machine.
    let mb = if o.bottleneck == Bottleneck::Memory {
        96
    } else {
        0
    };
    let src = vec![1u8; mb << 20];
    // Touched now, in the fixed run too (pinned memory is locked in when
    // allocated): left to the first copy's page faults, the recorded run
    // alone paid for them, inside its first step (80 ms, 170 on a busy
    // machine), and its prediction kept them.
    let mut staging = vec![2u8; mb << 20];
    let b = o.bottleneck;
    for step in 0..o.steps {
        // Next batch from the loader (round robin, like DataLoader).
        let a = now();
        let step_start = a;
        let mut msg = [0u8; BATCH_MSG];
        let from = (step % o.workers) as usize;
        readers[from]
            .read_exact(&mut msg)
            .unwrap_or_else(|e| die(&format!("worker died: {e}")));
        // Room for one more ahead (a worker done with its batches is gone).
        if let Some(t) = tokens[from].as_mut() {
            let _ = t.write_all(&[1]);
        }
        let at = |i: usize| u64::from_le_bytes(msg[i * 8..i * 8 + 8].try_into().unwrap());
        log_batch_wait(&mut log, input, (a, now()), (at(1), at(2)), at(3));

        match b {
            // Fixed: the step captured as one CUDA graph.
            Bottleneck::Launch if o.fix == Some(Fix::Launch) => {
                let (a, b) = dev.launch_graph(300, 4_000);
                log.add_waiting(a, b, "cpu.launch", dev.last_call_waited);
            }
            Bottleneck::Launch => {
                // Many tiny kernels: each launch costs more than it runs.
                // The loop's wait for a CPU is measured over the loop, not
                // summed over its calls: each call's own measurement puts
                // a read of the CPU clock (a syscall) between its two wall
                // clock reads, and that half microsecond, no wait at all,
                // summed over 18 000 calls made 10 ms of contention on a
                // quiet machine whose kernel saw the thread wait 1.5 ms
                // (perf sched) — more where syscalls cost more.
                log.cpu_work_blocking(0, "cpu.launch", || {
                    let blocked = dev.blocked_in_calls;
                    for _ in 0..300 {
                        dev.launch(4_000, launch_cost(30_000));
                    }
                    dev.blocked_in_calls - blocked
                });
            }
            Bottleneck::Memory => {
                dev.memcpy(&src, &mut staging, pinned);
                // Its waits for a CPU where they were: waking from its
                // sleeps (while the GPU had nothing to do) and staging.
                for p in &dev.last_call_pieces {
                    if p.waited > 0 && p.waited == p.end - p.start {
                        log.add_apart(p.start, p.end, "cpu.contention", 0);
                    } else {
                        log.add_apart(p.start, p.end, "memory", p.waited);
                    }
                }
                for _ in 0..4 {
                    let (a, b) = dev.launch(1_500_000, launch_cost(20_000));
                    log.add_waiting(a, b, "cpu.launch", dev.last_call_waited);
                }
            }
            Bottleneck::None => {
                for _ in 0..4 {
                    let (a, b) = dev.launch(5_000_000, launch_cost(20_000));
                    log.add_waiting(a, b, "cpu.launch", dev.last_call_waited);
                }
                // Stay ahead of the GPU, but not unboundedly (the launch
                // queue fills): wait only while it is busy.
                let a = now();
                sleep_until(dev.free_at.saturating_sub(30_000_000));
                log.add(a, now(), "cpu.host");
            }
            _ => {
                for _ in 0..4 {
                    let (a, b) = dev.launch(1_500_000, launch_cost(20_000));
                    log.add_waiting(a, b, "cpu.launch", dev.last_call_waited);
                }
            }
        }
        match b {
            Bottleneck::HostCpu if o.fix != Some(Fix::Host) => {
                log.cpu_work("cpu.host", || burn(14_000_000))
            }
            Bottleneck::Sync | Bottleneck::Mixed | Bottleneck::MixedNetwork
                if o.fix == Some(Fix::Sync) =>
            {
                // The same host work, no longer behind a synchronize.
                log.cpu_work("cpu.host", || burn(9_000_000));
            }
            Bottleneck::Sync | Bottleneck::Mixed | Bottleneck::MixedNetwork => {
                // loss.item(): wait for the GPU, then host work it cannot
                // hide — as much of it as the wait, which without the
                // synchronize would have overlapped the GPU's work.
                let (a, b) = dev.synchronize();
                log.add(a, b, "sync");
                // Fixed host work: what outlasted the GPU's is gone.
                let work = if o.fix == Some(Fix::Host) {
                    (b - a).min(9_000_000)
                } else {
                    9_000_000
                };
                log.cpu_work_after_sync(b - a, "cpu.host", || burn(work));
            }
            _ => {}
        }
        // Marked as training loops mark theirs (nvtx.range_push("step N")):
        // `gapscope diff` compares runs step by step.
        dev.range(format!("step {step}"), step_start, now());
        if o.lose_gpu_step == Some(step) {
            dev.lose_pending();
        } else {
            // Queueing the step's records for the device's sending thread.
            log.cpu_work("cpu.host", || dev.flush());
        }
    }
    // Wait for the device, like a final cudaDeviceSynchronize.
    sleep_until(dev.free_at);
    drop((src, staging));
    dev.goodbye();
    for r in readers {
        drop(r);
    }
    for c in children {
        // SAFETY: signalling and reaping our own children.
        unsafe {
            libc::kill(c, libc::SIGKILL);
            libc::waitpid(c, std::ptr::null_mut(), 0);
        }
    }
    let t_end = now();
    // Run dormant, the job is the profiler's from when it connected (the
    // agent finds jobs already running): the truth covers that part, what
    // a recording of it can be held to.
    let t_start = dev
        .sighted_at()
        .map_or(t_start, |s| s.clamp(t_start, t_end));
    let mut spans = std::mem::take(&mut dev.busy);
    union_in_place(&mut spans);
    spans.retain_mut(|(s, e)| {
        *s = (*s).max(t_start);
        *e = (*e).min(t_end);
        s < e
    });
    let (by_cause, contention_within) = log.idle_by_cause(&spans, t_start, t_end);
    let busy: u64 = spans.iter().map(|(s, e)| e - s).sum();
    let fields = |m: &BTreeMap<&str, u64>| -> String {
        m.iter()
            .map(|(k, v)| format!("\"{k}\": {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let lost = match dev.lost {
        Some((s, e, n)) => format!("{{\"start\": {s}, \"end\": {e}, \"records\": {n}}}"),
        None => "null".into(),
    };
    let json = format!(
        "{{\"simulated\": true, \"bottleneck\": \"{:?}\", \"busy_ns\": {busy}, \"allocated_ns\": {}, \"idle_by_cause_ns\": {{{}}}, \"contention_within_ns\": {{{}}}, \"lost_gpu\": {lost}, \"exit_waited_for_profiler_ns\": {}, \"blocked_in_launches_ns\": {}, \"bookkeeping_ns\": {}}}\n",
        b,
        t_end - t_start,
        fields(&by_cause),
        fields(&contention_within),
        dev.exit_waited,
        dev.blocked_in_calls,
        // This reckoning's own time, inside the recorded run: 20 ms for a
        // launch-bound run's 90k kernels in a debug build, 4 ms for its
        // fix's (one graph a step).
        now() - t_end
    );
    std::fs::write(&o.truth, json).unwrap_or_else(|e| die(&format!("{}: {e}", o.truth.display())));
    println!(
        "simtrain: done (SIMULATED GPU busy {:.1} ms of {:.1} ms)",
        busy as f64 / 1e6,
        (t_end - t_start) as f64 / 1e6
    );
}
