//! gs-inject-host: a stand-in for the CUDA driver's side of injection, for
//! tests on machines without a GPU. It loads the library named by
//! CUDA_INJECTION64_PATH (or the first argument) the way the driver does,
//! calls its InitializeInjection, then does a fixed amount of CPU work and
//! prints, as JSON, what it measured — so a test can check that the library
//! neither failed the process nor slowed it down (the work's wall time, and
//! what load does not move: its CPU time, the times it blocked, the CPU the
//! process's other threads took meanwhile). With GS_HOLD_MS set it
//! then stays alive that many milliseconds, for tests that attach to it.

use std::ffi::CString;
use std::time::Instant;

fn work(iterations: u64) -> u64 {
    let mut x: u64 = 1;
    for i in 0..iterations {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    std::hint::black_box(x)
}

/// CPU time (user and system, ns) and voluntary context switches of the
/// calling thread (`RUSAGE_THREAD`) or the process (`RUSAGE_SELF`).
fn usage(who: libc::c_int) -> (u64, u64) {
    // SAFETY: getrusage fills the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut r) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    (ns(r.ru_utime) + ns(r.ru_stime), r.ru_nvcsw as u64)
}

fn main() {
    let lib = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("CUDA_INJECTION64_PATH").ok());
    let t0 = Instant::now();
    let mut init_rc = None;
    if let Some(lib) = &lib {
        let c = CString::new(lib.as_str()).expect("path");
        // SAFETY: loading a library and calling its documented entry point.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
            if h.is_null() {
                eprintln!("gs-inject-host: cannot load {lib}");
                std::process::exit(3);
            }
            let sym = libc::dlsym(h, c"InitializeInjection".as_ptr());
            if sym.is_null() {
                eprintln!("gs-inject-host: {lib} has no InitializeInjection");
                std::process::exit(3);
            }
            let init: extern "C" fn() -> i32 = std::mem::transmute(sym);
            init_rc = Some(init());
        }
    }
    let init_ns = t0.elapsed().as_nanos() as u64;
    // GS_FORK_CHILD_MS: fork a child that outlives this process by sleeping
    // this long (a DataLoader worker forked after CUDA initialised).
    if let Some(ms) = std::env::var("GS_FORK_CHILD_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // SAFETY: the child only sleeps and exits without unwinding.
        unsafe {
            if libc::fork() == 0 {
                // Not the test's pipes either: only the shim's socket is
                // the question.
                libc::close(1);
                libc::close(2);
                libc::usleep((ms * 1000) as libc::c_uint);
                libc::_exit(0);
            }
        }
    }
    let (t1, thread0, process0) = (
        Instant::now(),
        usage(libc::RUSAGE_THREAD),
        usage(libc::RUSAGE_SELF),
    );
    work(200_000_000);
    let work_ns = t1.elapsed().as_nanos() as u64;
    let (thread1, process1) = (usage(libc::RUSAGE_THREAD), usage(libc::RUSAGE_SELF));
    // What a busy machine does not change: the work's own CPU time, the
    // times it blocked (a shim that stalls the process makes it sleep),
    // and the CPU its other threads (the shim's) took meanwhile.
    let work_cpu_ns = thread1.0 - thread0.0;
    let work_blocked = thread1.1 - thread0.1;
    let others_cpu_ns = (process1.0 - process0.0).saturating_sub(work_cpu_ns);
    println!(
        "{{\"pid\":{},\"init_rc\":{},\"init_ns\":{init_ns},\"work_ns\":{work_ns},\"work_cpu_ns\":{work_cpu_ns},\"work_blocked\":{work_blocked},\"others_cpu_ns\":{others_cpu_ns}}}",
        std::process::id(),
        init_rc
            .map(|r| r.to_string())
            .unwrap_or_else(|| "null".into())
    );
    // GS_HOLD_MS: stay alive this long afterwards, so a test can attach.
    if let Some(ms) = std::env::var("GS_HOLD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}
