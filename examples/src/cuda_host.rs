//! gs-cuda-host: a stand-in for "the CUDA driver plus a PyTorch-like
//! application", for testing gapscope's CUPTI shim on machines without a
//! GPU. It maps the stand-in libcupti (libcupti_standin.so from gs-fakecupti) the
//! way torch maps its own, loads the library named by CUDA_INJECTION64_PATH
//! and calls its InitializeInjection as cuInit does, then runs a training
//! loop of simulated kernels through the stand-in's control API, and prints
//! one JSON line of ground truth.

use std::ffi::{c_char, c_void, CStr, CString};
use std::io::Write;
use std::time::Duration;

use gapscope_wire::clock::{monotonic_ns, read as read_clock};
use serde_json::{json, Value};

#[path = "../fakecupti/src/control.rs"]
mod control;
use control::{Counts, KinetoStats};

const USAGE: &str = "\
gs-cuda-host: SIMULATED CUDA driver and training loop over the stand-in libcupti

usage: gs-cuda-host [options]

  --steps N               training steps (20)
  --kernel-us K           duration of each kernel on the simulated GPU (2000)
  --kernels-per-step M    kernels launched per step (3)
  --gap-us G              host time between steps, sleeping (3000)
  --sync-every-step       cudaDeviceSynchronize at the end of each step
  --queries Q             cudaEventQuery calls per step (0)
  --bookkeeping B         cudaGetDevice + cuCtxGetCurrent pairs per step (0)
  --memcpys C             64 MiB pageable host-to-device copies of 1 ms per step (0)
  --kineto-from A         start a torch.profiler-like CUPTI client before step A
  --kineto-to B           stop it before step B (B = steps: after the last)
  --pending N             after the final synchronize, launch N kernels of
                          200 ms and exit without waiting for them (0)
  --hold-ms MS            sleep before the script, so a profiler can attach (0)
  --await-delivery        before the pending kernels, wait (up to 60 s) until the
                          stand-in has handed at least one buffer to a client
  --exit normal|abort|sigkill-self
                          how the process ends (normal: return from main)
  --driver NAME           dlopen NAME first, as the process's CUDA driver (a
                          stand-in libcuda named libcuda.so.1 on LD_LIBRARY_PATH:
                          the shim asks it for device names and UUIDs)

The stand-in libcupti is $GS_FAKE_CUPTI, else libcupti_standin.so beside this program.
One JSON line of ground truth goes to stdout (times on CLOCK_MONOTONIC).";

fn die(msg: &str) -> ! {
    eprintln!("gs-cuda-host: {msg}\n\n{USAGE}");
    std::process::exit(2);
}

#[derive(Clone, Copy, PartialEq)]
enum Exit {
    Normal,
    Abort,
    SigkillSelf,
}

struct Opts {
    steps: u64,
    kernel_us: u64,
    kernels_per_step: u64,
    gap_us: u64,
    sync_every_step: bool,
    await_delivery: bool,
    queries: u64,
    bookkeeping: u64,
    memcpys: u64,
    kineto_from: Option<u64>,
    kineto_to: Option<u64>,
    pending: u64,
    hold_ms: u64,
    exit: Exit,
    driver: Option<String>,
}

fn parse() -> Opts {
    let mut o = Opts {
        steps: 20,
        kernel_us: 2000,
        kernels_per_step: 3,
        gap_us: 3000,
        sync_every_step: false,
        await_delivery: false,
        queries: 0,
        bookkeeping: 0,
        memcpys: 0,
        kineto_from: None,
        kineto_to: None,
        pending: 0,
        hold_ms: 0,
        exit: Exit::Normal,
        driver: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--sync-every-step" {
            o.sync_every_step = true;
            continue;
        }
        if arg == "--await-delivery" {
            o.await_delivery = true;
            continue;
        }
        if arg == "--help" || arg == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let Some(key) = arg.strip_prefix("--") else {
            die(&format!("unexpected argument {arg:?}"));
        };
        let value = args
            .next()
            .unwrap_or_else(|| die(&format!("--{key} needs a value")));
        let num = || -> u64 {
            value
                .parse()
                .unwrap_or_else(|_| die(&format!("--{key}: not a number: {value}")))
        };
        match key {
            "steps" => o.steps = num(),
            "kernel-us" => o.kernel_us = num(),
            "kernels-per-step" => o.kernels_per_step = num(),
            "gap-us" => o.gap_us = num(),
            "queries" => o.queries = num(),
            "bookkeeping" => o.bookkeeping = num(),
            "memcpys" => o.memcpys = num(),
            "kineto-from" => o.kineto_from = Some(num()),
            "kineto-to" => o.kineto_to = Some(num()),
            "pending" => o.pending = num(),
            "hold-ms" => o.hold_ms = num(),
            "driver" => o.driver = Some(value),
            "exit" => {
                o.exit = match value.as_str() {
                    "normal" => Exit::Normal,
                    "abort" => Exit::Abort,
                    "sigkill-self" => Exit::SigkillSelf,
                    _ => die(&format!(
                        "--exit: normal, abort or sigkill-self, not {value}"
                    )),
                }
            }
            _ => die(&format!("unknown option --{key}")),
        }
    }
    o
}

/// The stand-in's control API, bound from the copy of the library the
/// shim also sees.
struct Fake {
    launch_kernel: unsafe extern "C" fn(u64, *const c_char) -> u32,
    memcpy: extern "C" fn(u64, u64, u8) -> u32,
    synchronize: extern "C" fn() -> u32,
    event_query: extern "C" fn() -> u32,
    get_device: extern "C" fn() -> u32,
    ctx_get_current: extern "C" fn() -> u32,
    kineto_start: extern "C" fn(),
    kineto_stop: extern "C" fn(),
    kineto_stats: unsafe extern "C" fn(*mut KinetoStats),
    counts: unsafe extern "C" fn(*mut Counts),
    span: unsafe extern "C" fn(u32, *mut u64, *mut u64) -> u32,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open(path: &str, flags: libc::c_int) -> *mut c_void {
    let c = CString::new(path).unwrap_or_else(|_| die(&format!("bad path {path:?}")));
    // SAFETY: dlopen with a valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        eprintln!("gs-cuda-host: cannot load {path}: {}", dlerror());
        std::process::exit(3);
    }
    h
}

/// # Safety
/// `T` must be the symbol's real (function pointer) type.
unsafe fn sym<T: Copy>(handle: *mut c_void, name: &CStr) -> T {
    let p = libc::dlsym(handle, name.as_ptr());
    if p.is_null() {
        eprintln!("gs-cuda-host: missing symbol {}", name.to_string_lossy());
        std::process::exit(3);
    }
    std::mem::transmute_copy::<*mut c_void, T>(&p)
}

fn load_fake() -> (String, Fake) {
    let path = std::env::var("GS_FAKE_CUPTI").unwrap_or_else(|_| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("libcupti_standin.so")))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "libcupti_standin.so".into())
    });
    // GLOBAL, like torch's libcupti: already mapped when the shim looks.
    let h = open(&path, libc::RTLD_NOW | libc::RTLD_GLOBAL);
    // SAFETY: each symbol is bound to the type the stand-in defines it with.
    let fake = unsafe {
        Fake {
            launch_kernel: sym(h, c"fakecupti_launch_kernel"),
            memcpy: sym(h, c"fakecupti_memcpy"),
            synchronize: sym(h, c"fakecupti_synchronize"),
            event_query: sym(h, c"fakecupti_event_query"),
            get_device: sym(h, c"fakecupti_get_device"),
            ctx_get_current: sym(h, c"fakecupti_ctx_get_current"),
            kineto_start: sym(h, c"fakecupti_kineto_start"),
            kineto_stop: sym(h, c"fakecupti_kineto_stop"),
            kineto_stats: sym(h, c"fakecupti_kineto_stats"),
            counts: sym(h, c"fakecupti_counts"),
            span: sym(h, c"fakecupti_span"),
        }
    };
    (path, fake)
}

/// cuInit's part: load the injection library and call InitializeInjection.
/// Returns its result and how long the call took.
fn inject() -> (Option<i32>, u64) {
    let Ok(lib) = std::env::var("CUDA_INJECTION64_PATH") else {
        return (None, 0);
    };
    let h = open(&lib, libc::RTLD_NOW);
    // SAFETY: InitializeInjection is `int (void)` in CUDA's injection contract.
    let init: extern "C" fn() -> i32 = unsafe { sym(h, c"InitializeInjection") };
    let t0 = monotonic_ns();
    let rc = init();
    (Some(rc), monotonic_ns() - t0)
}

/// CLOCK_MONOTONIC minus the stand-in's GPU clock (CLOCK_REALTIME).
fn realtime_to_monotonic() -> i64 {
    gapscope_wire::clock::monotonic_minus(|| read_clock(libc::CLOCK_REALTIME))
}

struct Launched {
    correlation: u32,
    step: Option<u64>,
}

fn main() {
    let o = parse();
    if let Some(driver) = &o.driver {
        // Mapped for good, as a process's libcuda is.
        open(driver, libc::RTLD_NOW | libc::RTLD_GLOBAL);
    }
    let (cupti_path, fake) = load_fake();
    let (init_rc, init_ns) = inject();
    if o.hold_ms > 0 {
        std::thread::sleep(Duration::from_millis(o.hold_ms));
    }

    let step_kernel = c"gs_step_kernel";
    let pending_kernel = c"gs_pending_kernel";
    let mut steps = Vec::new();
    let mut kernels = Vec::new();
    let (mut kineto_start, mut kineto_end) = (None, None);
    // CUPTI calls made before torch.profiler's start: a dormant shim's.
    let mut calls_before_kineto: Option<u64> = None;
    let mut stop_kineto = |kineto_start: Option<u64>| {
        if kineto_start.is_some() && kineto_end.is_none() {
            (fake.kineto_stop)();
            kineto_end = Some(monotonic_ns());
        }
    };
    for step in 0..o.steps {
        if o.kineto_from == Some(step) {
            let mut c = Counts::default();
            // SAFETY: a writable struct of the stand-in's own layout.
            unsafe { (fake.counts)(&mut c) };
            calls_before_kineto = Some(c.client_calls);
            kineto_start = Some(monotonic_ns());
            (fake.kineto_start)();
        }
        if o.kineto_to == Some(step) {
            stop_kineto(kineto_start);
        }
        let start = monotonic_ns();
        for _ in 0..o.bookkeeping {
            (fake.get_device)();
            (fake.ctx_get_current)();
        }
        for _ in 0..o.memcpys {
            (fake.memcpy)(64 << 20, 1_000_000, 1);
        }
        for _ in 0..o.kernels_per_step {
            // SAFETY: a static NUL-terminated name.
            let correlation =
                unsafe { (fake.launch_kernel)(o.kernel_us * 1000, step_kernel.as_ptr()) };
            kernels.push(Launched {
                correlation,
                step: Some(step),
            });
        }
        for _ in 0..o.queries {
            (fake.event_query)();
        }
        if o.sync_every_step {
            (fake.synchronize)();
        }
        steps.push(json!({"index": step, "start_ns": start, "end_ns": monotonic_ns()}));
        if step + 1 < o.steps {
            std::thread::sleep(Duration::from_micros(o.gap_us));
        }
    }
    if o.kineto_to.is_some_and(|b| b >= o.steps) {
        stop_kineto(kineto_start);
    }
    // The work of the steps is finished; only --pending kernels are left
    // queued when the process ends.
    (fake.synchronize)();
    if o.await_delivery {
        // A test that kills the process needs something recorded first,
        // however slowly a loaded machine runs the shim's flush.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut c = Counts::default();
            // SAFETY: a writable struct of the stand-in's own layout.
            unsafe { (fake.counts)(&mut c) };
            if c.delivered_records > 0 || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for _ in 0..o.pending {
        // SAFETY: a static NUL-terminated name.
        let correlation = unsafe { (fake.launch_kernel)(200_000_000, pending_kernel.as_ptr()) };
        kernels.push(Launched {
            correlation,
            step: None,
        });
    }

    let offset = realtime_to_monotonic();
    let to_mono = |t: u64| (t as i64 + offset) as u64;
    let kernels: Vec<Value> = kernels
        .iter()
        .map(|k| {
            let (mut start, mut end) = (0u64, 0u64);
            // SAFETY: writable u64s.
            unsafe { (fake.span)(k.correlation, &mut start, &mut end) };
            json!({
                "correlation": k.correlation,
                "start_ns": to_mono(start),
                "end_ns": to_mono(end),
                "step": k.step,
                "pending": k.step.is_none(),
            })
        })
        .collect();
    let mut stats = KinetoStats::default();
    let mut counts = Counts::default();
    // SAFETY: writable structs of the stand-in's own layout.
    unsafe {
        (fake.kineto_stats)(&mut stats);
        (fake.counts)(&mut counts);
    }
    let truth = json!({
        "pid": std::process::id(),
        // SAFETY: gettid has no preconditions.
        "tid": unsafe { libc::gettid() },
        "cupti": cupti_path,
        "init_rc": init_rc,
        "init_ns": init_ns,
        "steps": steps,
        "kernels": kernels,
        "kineto": kineto_start.map(|s| json!({"start_ns": s, "end_ns": kineto_end})),
        "cupti_calls_before_kineto": calls_before_kineto,
        "kineto_stats": {
            "kernels": stats.kernels,
            "records": stats.records,
            "unknown_buffers": stats.unknown_buffers,
            "subscribe_rc": stats.subscribe_rc,
        },
        "counts": {
            "launched": counts.launched,
            "dropped": counts.dropped,
            "delivered_records": counts.delivered_records,
            "pending_records": counts.pending_records,
        },
    });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{truth}");
    let _ = out.flush();
    drop(out);
    match o.exit {
        Exit::Normal => {}
        // SAFETY: abort has no preconditions; ending without atexit
        // handlers is the point.
        Exit::Abort => unsafe { libc::abort() },
        // SAFETY: signalling ourselves; SIGKILL cannot be caught.
        Exit::SigkillSelf => unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        },
    }
}
