//! gs-bench: fixed-work workloads for `cargo xtask bench`. Each does the
//! same work every run, so its wall time under a profiler against bare is
//! the profiler's cost; each writes its own wall and CPU time (its children
//! included) to `--time-file`, measured from inside, so a profiler's start-up
//! and post-processing are not counted against it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

const USAGE: &str = "\
gs-bench: fixed-work workloads for gapscope's benchmarks

usage: gs-bench COMMAND [options] [--time-file F]

commands:
  input  --workers N --batches B --reads R --read-kib K --decode-passes P --dir D
         an input pipeline: N worker processes each read R small records
         (pread, K KiB, scattered over a page-cached 64 MiB file) per batch,
         decode them (P hashing passes), and hand a digest over a pipe to a
         consumer that computes a step on each of B batches
  relay  --chunks N --read-kib K --decode-passes P --dir D [--cpu C]
         a switch-heavy pipeline: a reader process reads a page-cached
         file in K KiB chunks and hands each over a pipe (one chunk deep)
         to a decoder process, which hashes it (P passes) and hands an
         8-byte digest over a second pipe to the consumer: three processes
         that block and wake each other for every chunk; all three pinned
         to CPU C when given (every hand-over a context switch, and runs
         that repeat: unpinned, where the scheduler puts them moves the
         wall time by a fifth from one run to the next)
  sites  --rounds N --slow-every K --slow-us U [--cpu C]
         one wait from two places: a child reads a pipe N times, every
         K-th read from one function (the parent sleeps U µs before it
         writes that byte) and the rest from another, both through the
         same helpers, so the two call paths differ two frames above the
         read; parent and child pinned to CPU C when given
  cpu    --threads N --iters M
         CPU-bound: N threads hashing M rounds each, no syscalls
  events --threads N --secs S --rate R [--cpu C] [--nice N]
         an event generator: threads in tight loops of cheap syscalls
         (getppid), paced to R syscalls/s in all (0 = as fast as they can),
         with a pipe ping-pong pair adding context switches; pinned to
         CPU C and at nice level N when given
  syscalls --iters N [--call getppid|read] [--cpu C]
         a bystander: one thread making N cheap syscalls in a loop,
         getppid (default) or a 1-byte read of /dev/zero, pinned to CPU C
         when given; prints the time per call on stderr

--time-file F gets one line: wall_ns cpu_ns (children included).

  gs-bench hooks -- COMMAND [ARGS...]
         runs COMMAND with a BPF program that does nothing attached to each
         tracepoint a gapscope recording attaches to: what any recorder
         hooked there pays before it does any work of its own (root)";

mod args;
mod cpus;
use args::Args;

fn die(msg: &str) -> ! {
    args::die("gs-bench", msg)
}

fn cpu_ns(who: i32) -> u64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The same arithmetic everywhere: a multiply-xor hash step.
#[inline(always)]
fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(0x100000001b3).rotate_left(5)
}

fn hash_bytes(h: u64, buf: &[u8]) -> u64 {
    buf.chunks_exact(8)
        .fold(h, |h, w| mix(h, u64::from_le_bytes(w.try_into().unwrap())))
}

fn compute(rounds: u64, seed: u64) -> u64 {
    let mut h = seed;
    for i in 0..rounds {
        h = mix(h, i);
    }
    std::hint::black_box(h)
}

const FILE_LEN: u64 = 64 << 20;

/// A 64 MiB file in `--dir`, read once so that runs compare CPU work, not
/// the disk.
fn cached_file(a: &Args, name: &str) -> std::path::PathBuf {
    let path = a
        .dir()
        .join(format!("gs-bench-{name}-{}.dat", std::process::id()));
    let mut f = File::create(&path).unwrap_or_else(|e| die(&format!("{}: {e}", path.display())));
    let block: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(31) % 251) as u8)
        .collect();
    for _ in 0..FILE_LEN >> 20 {
        f.write_all(&block).unwrap();
    }
    drop(f);
    let _ = std::fs::read(&path);
    path
}

/// A pipe that holds at most `len` bytes (the kernel rounds up to a page):
/// its writer blocks until the reader has taken what it wrote.
fn short_pipe(len: usize) -> [i32; 2] {
    let mut fds = [0; 2];
    // SAFETY: fds is a 2-element array; F_SETPIPE_SZ on a pipe we own.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::fcntl(fds[1], libc::F_SETPIPE_SZ, len as libc::c_int);
    }
    fds
}

/// Reads exactly `buf.len()` bytes from `fd`; false at its end.
fn read_full(fd: i32, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the live rest of `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n <= 0 {
            return false;
        }
        got += n as usize;
    }
    true
}

/// Writes all of `buf` to `fd`.
fn write_full(fd: i32, buf: &[u8]) {
    let mut put = 0;
    while put < buf.len() {
        // SAFETY: writing from the live rest of `buf`.
        let n = unsafe { libc::write(fd, buf[put..].as_ptr().cast(), buf.len() - put) };
        if n <= 0 {
            die("a pipe closed");
        }
        put += n as usize;
    }
}

/// In a child process: `f`, then exit.
fn fork_child(f: impl FnOnce()) -> i32 {
    // SAFETY: every caller's child only computes, does file and pipe I/O
    // and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    if child == 0 {
        f();
        std::process::exit(0);
    }
    child
}

/// Waits for each of our `children` to end.
fn reap(children: impl IntoIterator<Item = i32>) {
    for c in children {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(c, &mut status, 0) };
    }
}

fn cmd_relay(a: &Args) {
    let chunks = a.num("chunks", 100_000);
    let len = (a.num("read-kib", 4) << 10) as usize;
    let passes = a.num("decode-passes", 2);
    let path = cached_file(a, "relay");
    // Inherited by the children forked below.
    pin(a.get("cpu").map(|_| a.num("cpu", 0)));
    let start = Instant::now();
    let raw = short_pipe(len);
    let digests = short_pipe(8);
    let reader = fork_child(|| {
        // SAFETY: closing the ends this process does not use.
        unsafe {
            libc::close(raw[0]);
            libc::close(digests[0]);
            libc::close(digests[1]);
        }
        let f = File::open(&path).unwrap();
        let mut buf = vec![0u8; len];
        for c in 0..chunks {
            let off = (c * len as u64) % (FILE_LEN - len as u64);
            f.read_exact_at(&mut buf, off).unwrap();
            write_full(raw[1], &buf);
        }
    });
    let decoder = fork_child(|| {
        // SAFETY: as above.
        unsafe {
            libc::close(raw[1]);
            libc::close(digests[0]);
        }
        let mut buf = vec![0u8; len];
        while read_full(raw[0], &mut buf) {
            let mut h = 0;
            for _ in 0..passes {
                h = hash_bytes(h, &buf);
            }
            write_full(digests[1], &h.to_le_bytes());
        }
    });
    // SAFETY: closing the ends the children own.
    unsafe {
        libc::close(raw[0]);
        libc::close(raw[1]);
        libc::close(digests[1]);
    }
    let mut acc = 0u64;
    let mut d = [0u8; 8];
    let mut n = 0;
    while read_full(digests[0], &mut d) {
        acc = compute(500, acc ^ u64::from_le_bytes(d));
        n += 1;
    }
    reap([reader, decoder]);
    if n != chunks {
        die(&format!("{n} digests of {chunks} chunks"));
    }
    std::hint::black_box(acc);
    let wall = start.elapsed();
    let _ = std::fs::remove_file(&path);
    finish(a, wall.as_nanos() as u64);
}

fn cmd_input(a: &Args) {
    let workers = a.num("workers", 4);
    let batches = a.num("batches", 2000);
    let reads = a.num("reads", 64);
    let read_len = (a.num("read-kib", 4) << 10) as usize;
    let passes = a.num("decode-passes", 8);
    let path = cached_file(a, "input");

    let start = Instant::now();
    let mut readers = Vec::new();
    let mut children = Vec::new();
    for w in 0..workers {
        let mut fds = [0; 2];
        // SAFETY: fds is a 2-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let child = fork_child(|| {
            // SAFETY: closing the read end we do not use.
            unsafe { libc::close(fds[0]) };
            let f = File::open(&path).unwrap();
            let mut buf = vec![0u8; read_len];
            let mut x: u64 = 0x9e3779b97f4a7c15 ^ w;
            for b in (0..batches).filter(|b| b % workers == w) {
                let mut h = b;
                for _ in 0..reads {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 20) % (FILE_LEN - read_len as u64);
                    f.read_exact_at(&mut buf, off & !4095).unwrap();
                    for _ in 0..passes {
                        h = hash_bytes(h, &buf);
                    }
                }
                let d = h.to_le_bytes();
                // SAFETY: writing 8 bytes from a live buffer to our pipe.
                unsafe { libc::write(fds[1], d.as_ptr().cast(), 8) };
            }
        });
        // SAFETY: closing the write end the child owns.
        unsafe { libc::close(fds[1]) };
        readers.push(fds[0]);
        children.push(child);
    }
    let mut acc = 0u64;
    for b in 0..batches {
        let mut d = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from our pipe.
        let n = unsafe { libc::read(readers[(b % workers) as usize], d.as_mut_ptr().cast(), 8) };
        if n != 8 {
            die("a worker died");
        }
        acc = compute(20_000, acc ^ u64::from_le_bytes(d));
    }
    reap(children);
    std::hint::black_box(acc);
    let wall = start.elapsed();
    let _ = std::fs::remove_file(&path);
    finish(a, wall.as_nanos() as u64);
}

fn cmd_cpu(a: &Args) {
    let threads = a.num("threads", 2);
    let iters = a.num("iters", 400_000_000);
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| std::thread::spawn(move || compute(iters, t)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    finish(a, start.elapsed().as_nanos() as u64);
}

fn pin(cpu: Option<u64>) {
    if let Some(cpu) = cpu {
        // As before: a CPU that cannot be had leaves the thread unpinned.
        let _ = cpus::pin_to(cpu as usize);
    }
}

/// One blocking read through two helpers, so that which site called is
/// two return addresses up from the read.
#[inline(never)]
fn wait_on(fd: i32) {
    let mut b = [0u8; 1];
    if !std::hint::black_box(read_full(fd, &mut b)) {
        die("a pipe closed");
    }
}

#[inline(never)]
fn wait_slow(fd: i32) {
    wait_on(std::hint::black_box(fd));
}

#[inline(never)]
fn wait_fast(fd: i32) {
    wait_on(std::hint::black_box(fd));
}

fn cmd_sites(a: &Args) {
    let rounds = a.num("rounds", 20_000);
    let every = a.num("slow-every", 20).max(1);
    let slow = std::time::Duration::from_micros(a.num("slow-us", 1000));
    let cpu = a.get("cpu").map(|_| a.num("cpu", 0));
    pin(cpu);
    let (to_child, to_parent) = (short_pipe(1), short_pipe(1));
    let start = Instant::now();
    let child = fork_child(|| {
        for i in 0..rounds {
            if i % every == 0 {
                wait_slow(to_child[0]);
            } else {
                wait_fast(to_child[0]);
            }
            write_full(to_parent[1], &[1]);
        }
    });
    let mut b = [0u8; 1];
    for i in 0..rounds {
        if i % every == 0 {
            std::thread::sleep(slow);
        }
        write_full(to_child[1], &[1]);
        if !read_full(to_parent[0], &mut b) {
            die("the child ended early");
        }
    }
    reap([child]);
    let wall = start.elapsed().as_nanos() as u64;
    eprintln!(
        "gs-bench sites: {rounds} reads, {} slow ({} µs each)",
        rounds.div_ceil(every),
        slow.as_micros()
    );
    finish(a, wall);
}

fn cmd_events(a: &Args) {
    let threads = a.num("threads", 1).max(1);
    let secs = a.num("secs", 2);
    let rate = a.num("rate", 0);
    let cpu = a.get("cpu").map(|_| a.num("cpu", 0));
    pin(cpu);
    if let Some(n) = a.get("nice") {
        let n: i32 = n
            .parse()
            .unwrap_or_else(|_| die(&format!("--nice: not a number: {n}")));
        // SAFETY: setpriority on this process; a higher priority needs root.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) } != 0 {
            die("--nice: setpriority failed (a negative level needs root)");
        }
    }
    let start = Instant::now();
    let end = start + std::time::Duration::from_secs(secs);
    let per_thread = rate / threads;
    let mut hs = Vec::new();
    for _ in 0..threads {
        hs.push(std::thread::spawn(move || {
            pin(cpu);
            let t0 = Instant::now();
            let mut n: u64 = 0;
            while Instant::now() < end {
                for _ in 0..64 {
                    // SAFETY: getppid has no preconditions.
                    unsafe { libc::getppid() };
                }
                n += 64;
                if per_thread > 0 {
                    // Pace: never ahead of rate × elapsed.
                    while (n as u128) * 1_000_000_000
                        > (per_thread as u128) * t0.elapsed().as_nanos()
                    {
                        std::hint::spin_loop();
                    }
                }
            }
            n
        }));
    }
    // A ping-pong pair: every round trip is two blocking reads, two wakeups
    // and two context switches.
    let mut p1 = [0; 2];
    let mut p2 = [0; 2];
    // SAFETY: 2-element arrays.
    unsafe {
        libc::pipe(p1.as_mut_ptr());
        libc::pipe(p2.as_mut_ptr());
    }
    let pong = std::thread::spawn(move || {
        pin(cpu);
        let mut b = [0u8; 1];
        // SAFETY: reading/writing one byte on our pipes.
        while unsafe { libc::read(p1[0], b.as_mut_ptr().cast(), 1) } == 1 && b[0] == 1 {
            unsafe { libc::write(p2[1], b.as_ptr().cast(), 1) };
        }
    });
    let mut trips = 0u64;
    while Instant::now() < end {
        let mut b = [1u8; 1];
        // SAFETY: as above.
        unsafe {
            libc::write(p1[1], b.as_ptr().cast(), 1);
            libc::read(p2[0], b.as_mut_ptr().cast(), 1);
        }
        trips += 1;
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let b = [0u8; 1];
    // SAFETY: as above.
    unsafe { libc::write(p1[1], b.as_ptr().cast(), 1) };
    pong.join().unwrap();
    let syscalls: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    let wall = start.elapsed().as_nanos() as u64;
    eprintln!(
        "gs-bench events: {syscalls} getppid ({:.0}/s), {trips} ping-pong round trips",
        syscalls as f64 / (wall as f64 / 1e9)
    );
    finish(a, wall);
}

fn cmd_syscalls(a: &Args) {
    let iters = a.num("iters", 5_000_000);
    let call = a.get("call").unwrap_or("getppid");
    pin(a.get("cpu").map(|_| a.num("cpu", 0)));
    let zero = match call {
        "getppid" => None,
        "read" => Some(File::open("/dev/zero").unwrap_or_else(|e| die(&format!("/dev/zero: {e}")))),
        other => die(&format!("--call: getppid or read, not {other:?}")),
    };
    let mut b = [0u8; 1];
    let start = Instant::now();
    match &zero {
        None => {
            for _ in 0..iters {
                // SAFETY: getppid has no preconditions.
                std::hint::black_box(unsafe { libc::getppid() });
            }
        }
        Some(f) => {
            use std::os::fd::AsRawFd;
            let fd = f.as_raw_fd();
            for _ in 0..iters {
                // SAFETY: reading one byte into a live buffer from our fd.
                std::hint::black_box(unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) });
            }
        }
    }
    let wall = start.elapsed().as_nanos() as u64;
    eprintln!(
        "gs-bench syscalls: {iters} {} in {:.3} s = {:.1} ns each",
        if zero.is_some() {
            "1-byte reads of /dev/zero"
        } else {
            "getppid"
        },
        wall as f64 / 1e9,
        wall as f64 / iters.max(1) as f64
    );
    finish(a, wall);
}

fn finish(a: &Args, wall_ns: u64) {
    let cpu = cpu_ns(libc::RUSAGE_SELF) + cpu_ns(libc::RUSAGE_CHILDREN);
    if let Some(p) = a.get("time-file") {
        std::fs::write(p, format!("{wall_ns} {cpu}\n"))
            .unwrap_or_else(|e| die(&format!("{p}: {e}")));
    }
}

fn main() {
    // Not `--key value` options: a command line to run.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("hooks") {
        cmd_hooks(&argv[2..]);
    }
    let a = Args::parse("gs-bench");
    match a.cmd.as_str() {
        "input" => cmd_input(&a),
        "relay" => cmd_relay(&a),
        "sites" => cmd_sites(&a),
        "cpu" => cmd_cpu(&a),
        "events" => cmd_events(&a),
        "syscalls" => cmd_syscalls(&a),
        "-h" | "--help" | "help" => println!("{USAGE}"),
        "" => die(&format!("missing command\n\n{USAGE}")),
        other => die(&format!("unknown command {other:?}\n\n{USAGE}")),
    }
}

/// `hooks -- COMMAND...`: COMMAND run with empty BPF programs on gapscope's
/// tracepoints, attached from before it starts until it ends; exits with
/// its status.
fn cmd_hooks(rest: &[String]) -> ! {
    let cmd = match rest.split_first() {
        Some((dash, cmd)) if dash == "--" && !cmd.is_empty() => cmd,
        _ => die("hooks: usage: gs-bench hooks -- COMMAND [ARGS...]"),
    };
    let links: Vec<std::os::fd::OwnedFd> = gapscope::collect::bpf::tracepoints(false)
        .map(|tp| empty_program_on(tp).unwrap_or_else(|e| die(&format!("hooks: {tp}: {e}"))))
        .collect();
    let status = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .status()
        .unwrap_or_else(|e| die(&format!("hooks: {}: {e}", cmd[0])));
    drop(links);
    std::process::exit(status.code().unwrap_or(1));
}

/// A raw-tracepoint BPF program that returns at once, attached to `tp`:
/// the fd that keeps it attached.
fn empty_program_on(tp: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // include/uapi/linux/bpf.h: commands, the program type, and the
    // attributes' layout (zeroed past what is set).
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
    const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
    // r0 = 0; exit
    let insns: [u64; 2] = [
        0x0000_0000_0000_00b7u64.to_le(),
        0x0000_0000_0000_0095u64.to_le(),
    ];
    let license = c"GPL";
    let bpf = |cmd: libc::c_long, attr: &mut [u8; 128]| -> std::io::Result<i32> {
        // SAFETY: attr is a live, zero-padded 128-byte bpf_attr.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
        match r {
            r if r < 0 => Err(std::io::Error::last_os_error()),
            r => Ok(r as i32),
        }
    };
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_RAW_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let prog = bpf(BPF_PROG_LOAD, &mut attr)?;
    // SAFETY: bpf(2) just gave us this fd.
    let prog = unsafe { std::os::fd::OwnedFd::from_raw_fd(prog) };
    let name = std::ffi::CString::new(tp).map_err(std::io::Error::other)?;
    let mut attr = [0u8; 128];
    attr[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    use std::os::fd::AsRawFd;
    attr[8..12].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)?;
    // SAFETY: as above; the link holds the program.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(link) })
}
