//! `cargo xtask bench`: what gapscope costs, every figure against a baseline
//! measured in the same run. Overhead alternates bare and profiled runs of
//! fixed-work workloads and takes the median ratio (perf, strace and bpftrace
//! beside gapscope where installed); bystander times a loop of cheap
//! syscalls in a process nobody records, bare and while another process is
//! recorded; throughput finds the highest event rate recorded without drops;
//! python times a Python-heavy job recorded with and without walking its
//! frames, beside CPython's own perf trampoline, and what each names;
//! offline times `report` on synthetic sessions (1 M, 10 M and, where memory
//! and disk allow, 40 M and 300 M events), with how its peak memory grows
//! from one to the next, and a synthetic PyTorch trace; agent times a
//! job alone and watched by `gapscope agent`, with the agent's own CPU and
//! memory. One table at
//! the end, each target marked met or not, with what bounds it when not.
//! `cargo xtask bench offline` (any of overhead, bystander, throughput,
//! python, offline, kineto, agent) runs only those.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{build_release, describe, have, is_root, root, setup};

/// Bare/profiled pairs per overhead case (GAPSCOPE_BENCH_ROUNDS overrides,
/// for a quick look; the table says how many were run).
const ROUNDS: usize = 5;

enum Verdict {
    Met,
    /// Not met, and what bounds it.
    Missed(String),
    /// A figure without a target.
    Info,
    /// Not run here; the row says why.
    NotRun,
}

struct Row {
    case: String,
    measured: String,
    target: String,
    verdict: Verdict,
}

struct Bench {
    release: PathBuf,
    dir: PathBuf,
    rounds: usize,
}

impl Bench {
    fn bin(&self, name: &str) -> PathBuf {
        self.release.join(name)
    }
}

/// Runs a command to completion; returns (wall seconds, peak RSS bytes).
fn measure(cmd: &mut Command) -> Result<(f64, u64)> {
    measure_into(cmd, Stdio::null())
}

/// `measure`, its standard output going to `stdout`.
fn measure_into(cmd: &mut Command, stdout: Stdio) -> Result<(f64, u64)> {
    let start = Instant::now();
    let child = cmd.stdout(stdout).spawn().with_context(|| describe(cmd))?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as i32;
    // SAFETY: waiting for our own child.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        bail!("wait4 failed for {}", describe(cmd));
    }
    if libc::WIFSIGNALED(status) {
        bail!(
            "{} killed by signal {} (SIGKILL: likely the OOM killer; SIGABRT: an allocation failed)",
            describe(cmd),
            libc::WTERMSIG(status)
        );
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!(
            "{} failed (exit {})",
            describe(cmd),
            libc::WEXITSTATUS(status)
        );
    }
    Ok((start.elapsed().as_secs_f64(), usage.ru_maxrss as u64 * 1024))
}

fn quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| describe(cmd))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            describe(cmd),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn report_json(b: &Bench, path: &Path) -> Result<Value> {
    let out = Command::new(b.bin("gapscope"))
        .args(["report", "--format", "json"])
        .arg(path)
        .output()?;
    if !out.status.success() {
        bail!(
            "gapscope report {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// How far runs of the same thing stray from their median, as a fraction of
/// it (the median absolute deviation): differences of ratios smaller than
/// this are the machine's noise, not a cost.
fn spread(v: &[f64]) -> f64 {
    let m = median(v.to_vec());
    median(v.iter().map(|x| (x - m).abs()).collect()) / m
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb as f64 / (1 << 20) as f64))
        .unwrap_or_default();
    format!(
        "{cpus} CPUs ({model}) · {} · Linux {kernel} · {mem}",
        std::env::consts::ARCH
    )
}

/// (wall ns, CPU ns), as a workload measured itself.
type Times = (f64, f64);

/// A profiler to compare with: how it runs a command.
struct Profiler {
    name: &'static str,
    /// Runs the workload under it: (wall ns, CPU ns) as the workload
    /// measured itself.
    run: fn(&Bench, usize, &[String]) -> Result<Times>,
}

fn bare(_: &Bench, _: usize, cmd: &[String]) -> Command {
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    c
}

/// `gapscope run` of `cmd` with `options`, recording into `rec` (in the
/// bench's directory).
fn under_gapscope(b: &Bench, options: &[&str], rec: String, cmd: &[String]) -> Command {
    let mut c = Command::new(b.bin("gapscope"));
    c.args(["run", "-q"])
        .args(options)
        .arg("-o")
        .arg(b.dir.join(rec))
        .arg("--")
        .args(cmd);
    c
}

fn under_perf(b: &Bench, _: usize, cmd: &[String]) -> Command {
    let mut c = Command::new("perf");
    c.args(["record", "-g", "-q", "-o"])
        .arg(b.dir.join("perf.data"))
        .arg("--")
        .args(cmd);
    c
}

fn under_strace(b: &Bench, _: usize, cmd: &[String]) -> Command {
    let mut c = Command::new("strace");
    c.args(["-f", "-qq", "-o"])
        .arg(b.dir.join("strace.out"))
        .args(cmd);
    c
}

/// The workload under bpftrace: the program attached first, the workload
/// run bare, then the program stopped. bpftrace selects the workload's
/// threads by name (comm "gs-bench"): the workloads fork without exec, so
/// every process of the tree keeps it.
fn under_bpftrace(b: &Bench, _: usize, cmd: &[String]) -> Result<Times> {
    let tracer = Bpftrace::start(b, "comm == \"gs-bench\"")?;
    let t = timed(b, bare(b, 0, cmd))?;
    let out = tracer.stop()?;
    if !out.contains("@lat") {
        bail!(
            "bpftrace saw none of the workload's syscalls: {}",
            out.trim()
        );
    }
    Ok(t)
}

/// The bpftrace program the recording-cost issue measured: a histogram of
/// syscall latency and a count of context switches for the threads
/// `filter` selects, nothing recorded per event. Like gapscope's, its
/// syscall probes fire for every task on the machine; the filter is the
/// first thing each runs.
fn bpftrace_program(filter: &str) -> String {
    format!(
        "tracepoint:raw_syscalls:sys_enter /{filter}/ {{ @start[tid] = nsecs; }}\n\
         tracepoint:raw_syscalls:sys_exit /{filter} && @start[tid]/ \
         {{ @lat = hist(nsecs - @start[tid]); delete(@start[tid]); }}\n\
         tracepoint:sched:sched_switch /{filter}/ {{ @sw = count(); }}\n"
    )
}

/// A child that is signalled and reaped if still running when dropped, so
/// that no recorder outlives the bench, whatever fails.
struct Running {
    child: Option<std::process::Child>,
    /// What stops it.
    signal: i32,
}

impl Running {
    fn spawn(cmd: &mut Command, signal: i32) -> Result<Running> {
        let child = cmd.spawn().with_context(|| describe(cmd))?;
        Ok(Running {
            child: Some(child),
            signal,
        })
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Whether it has exited already (reaped; its status is lost).
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Signals it and waits for it to exit.
    fn stop(mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("stopped twice")?;
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, self.signal) };
        Ok(child.wait()?)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, self.signal) };
            let _ = child.wait();
        }
    }
}

/// Waits up to a minute for `ready` to say so; fails when `proc` exits
/// first.
fn wait_until(proc: &mut Running, what: &str, ready: impl Fn() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ready() {
        if proc.exited() {
            bail!("{what} exited before it was ready");
        }
        if start.elapsed().as_secs() >= 60 {
            bail!("{what} not ready after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// bpftrace running `bpftrace_program(filter)`, attached.
struct Bpftrace {
    proc: Running,
    out: PathBuf,
    err: PathBuf,
}

impl Bpftrace {
    /// Starts it and returns once it says "Attaching N probes..." (printed
    /// when its probes are in place).
    fn start(b: &Bench, filter: &str) -> Result<Bpftrace> {
        let out = b.dir.join("bpftrace.out");
        let err = b.dir.join("bpftrace.err");
        let mut proc = Running::spawn(
            Command::new("bpftrace")
                .arg("-e")
                .arg(bpftrace_program(filter))
                .stdout(std::fs::File::create(&out)?)
                .stderr(std::fs::File::create(&err)?),
            libc::SIGINT,
        )?;
        let attached = || std::fs::read_to_string(&out).is_ok_and(|t| t.contains("Attaching"));
        if let Err(e) = wait_until(&mut proc, "bpftrace", attached) {
            let why = std::fs::read_to_string(&err).unwrap_or_default();
            bail!("{e}: {}", why.trim());
        }
        Ok(Bpftrace { proc, out, err })
    }

    /// Stops it (SIGINT: it prints its maps and exits); what it printed.
    fn stop(self) -> Result<String> {
        let status = self.proc.stop()?;
        if !status.success() {
            bail!(
                "bpftrace failed ({status}): {}",
                std::fs::read_to_string(&self.err)
                    .unwrap_or_default()
                    .trim()
            );
        }
        Ok(std::fs::read_to_string(&self.out)?)
    }
}

/// Whether bpftrace is installed and can attach the program here (it needs
/// the syscall and scheduler tracepoints, so tracefs mounted); why not
/// when it is installed but cannot.
fn bpftrace_usable() -> Option<Result<(), String>> {
    if !have("bpftrace") {
        return None;
    }
    // bpftrace finds tracepoints through tracefs, which not every system
    // mounts; gapscope itself does not need it.
    let tracefs = Path::new("/sys/kernel/tracing");
    if !tracefs.join("events").exists() && tracefs.exists() {
        let mounted = Command::new("mount")
            .args(["-t", "tracefs", "tracefs"])
            .arg(tracefs)
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            eprintln!("xtask: bench: mounted tracefs at /sys/kernel/tracing for bpftrace");
        }
    }
    let out = Command::new("bpftrace")
        .arg("-e")
        .arg(bpftrace_program("pid == 0") + "BEGIN { exit(); }\n")
        .stdin(Stdio::null())
        .output();
    Some(match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            // Its error, not the warning about RLIMIT_MEMLOCK it prints
            // even when it works.
            let text = String::from_utf8_lossy(&o.stderr);
            let mut errors = text
                .lines()
                .filter(|l| l.contains("ERROR") && !l.contains("RLIMIT_MEMLOCK"));
            Err(errors
                .next_back()
                .or_else(|| text.lines().rfind(|l| !l.trim().is_empty()))
                .unwrap_or("failed")
                .trim()
                .to_string())
        }
        Err(e) => Err(e.to_string()),
    })
}

/// bpftrace as a peer where it is installed and works; a line on stderr
/// when it is installed and does not.
fn bpftrace_peer() -> Option<Profiler> {
    match bpftrace_usable()? {
        Ok(()) => Some(Profiler {
            name: "bpftrace",
            run: under_bpftrace,
        }),
        Err(why) => {
            eprintln!(
                "xtask: bench: bpftrace is installed but cannot attach here ({why}); not compared"
            );
            None
        }
    }
}

/// Runs a workload; what it measured itself.
fn timed(b: &Bench, mut cmd: Command) -> Result<Times> {
    let file = b.dir.join("time");
    let _ = std::fs::remove_file(&file);
    quiet(&mut cmd)?;
    let text = std::fs::read_to_string(&file).context("the workload's time file")?;
    let mut it = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(0.0));
    Ok((it.next().unwrap_or(0.0), it.next().unwrap_or(0.0)))
}

const BARE_AGAIN: &str = "bare again";
const EMPTY_PROGRAMS: &str = "empty BPF programs at gapscope's tracepoints";

fn peers(b: &Bench) -> Vec<Profiler> {
    let mut v = vec![
        Profiler {
            name: "gapscope",
            run: |b, round, cmd| timed(b, under_gapscope(b, &[], format!("rec-{round}"), cmd)),
        },
        Profiler {
            name: "gapscope --syscalls all",
            run: |b, round, cmd| {
                let rec = format!("rec-all-{round}");
                timed(b, under_gapscope(b, &["--syscalls", "all"], rec, cmd))
            },
        },
        // A placebo: the bare workload again, in its turn among the
        // profilers. How far its ratio strays from 1 is what this machine's
        // drift does to every ratio in the same run.
        Profiler {
            name: BARE_AGAIN,
            run: |b, round, cmd| timed(b, bare(b, round, cmd)),
        },
    ];
    let probe = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if probe(
        Command::new("perf")
            .args(["record", "-g", "-q", "-o"])
            .arg(b.dir.join("probe.data"))
            .args(["--", "true"]),
    ) {
        v.push(Profiler {
            name: "perf record -g",
            run: |b, round, cmd| timed(b, under_perf(b, round, cmd)),
        });
    }
    if have("strace") {
        v.push(Profiler {
            name: "strace -f",
            run: |b, round, cmd| timed(b, under_strace(b, round, cmd)),
        });
    }
    v.extend(bpftrace_peer());
    v
}

struct OverheadCase {
    name: &'static str,
    args: Vec<String>,
    /// The target ratio, of the job's wall and of its CPU time.
    target: f64,
    /// Judged against bpftrace too: a case of syscalls, which is all
    /// bpftrace's program hooks (it samples nothing).
    versus_bpftrace: bool,
    /// Also measured with each part of the recording turned off alone, and
    /// with each BPF program's own run time: where the cost goes.
    parts: bool,
    /// Rounds at least (each one bare run and one under each profiler).
    min_rounds: usize,
}

/// The recording with one part of it off, as a peer: what that part costs.
fn gapscope_without_offcpu_stacks(b: &Bench, round: usize, cmd: &[String]) -> Result<Times> {
    let rec = format!("rec-nostacks-{round}");
    timed(b, under_gapscope(b, &["--no-offcpu-stacks"], rec, cmd))
}

/// Not gapscope: a program that does nothing on each tracepoint gapscope
/// attaches to. The floor of any recorder hooked there, which the
/// recording's own work adds to.
fn empty_programs(b: &Bench, _: usize, cmd: &[String]) -> Result<Times> {
    let mut c = under_empty_programs(b);
    c.args(cmd);
    timed(b, c)
}

/// `gs-bench hooks --`, the command to follow.
fn under_empty_programs(b: &Bench) -> Command {
    let mut c = Command::new(b.bin("gs-bench"));
    c.args(["hooks", "--"]);
    c
}

fn gapscope_without_samples(b: &Bench, round: usize, cmd: &[String]) -> Result<Times> {
    let rec = format!("rec-nosamples-{round}");
    timed(b, under_gapscope(b, &["--freq", "0"], rec, cmd))
}

/// Each BPF program of one default recording of `cmd`: its runs, the time
/// they took per run and in all, against the bare run's CPU time `bare_cpu`
/// (ns), most costly first.
fn program_shares(b: &Bench, cmd: &[String], bare_cpu: f64) -> Result<String> {
    let costs = program_costs(under_gapscope(b, &[], "rec-programs".into(), cmd))?;
    let mut v: Vec<(String, (u64, u64))> = costs
        .into_iter()
        .filter(|(name, (_, runs))| name.starts_with("gs_") && *runs > 0)
        .collect();
    v.sort_by_key(|(_, (ns, _))| std::cmp::Reverse(*ns));
    Ok(v.iter()
        .map(|(name, (ns, runs))| {
            format!(
                "{name} {:.1}k runs × {:.0} ns = {:.2}%",
                *runs as f64 / 1e3,
                *ns as f64 / *runs as f64,
                *ns as f64 / bare_cpu * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", "))
}

fn overhead(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let all_peers = peers(b);
    let dir = b.dir.to_str().unwrap().to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases = [
        OverheadCase {
            name: "input pipeline",
            args: s(&[
                "input",
                "--workers",
                "4",
                "--batches",
                "3000",
                "--reads",
                "16",
                "--read-kib",
                "16",
                "--decode-passes",
                "24",
                "--dir",
                &dir,
            ]),
            target: 1.01,
            versus_bpftrace: true,
            parts: false,
            min_rounds: 0,
        },
        // Three processes that block and wake each other for every 4 KiB
        // chunk: the scheduler tracepoints and the blocked-time stacks at
        // their most frequent.
        OverheadCase {
            name: "switch-heavy pipeline",
            args: s(&[
                "relay",
                "--chunks",
                "50000",
                "--read-kib",
                "4",
                "--decode-passes",
                "2",
                "--cpu",
                "1",
                "--dir",
                &dir,
            ]),
            target: 1.01,
            versus_bpftrace: true,
            parts: true,
            min_rounds: 9,
        },
        OverheadCase {
            name: "CPU-bound",
            args: s(&["cpu", "--threads", "2", "--iters", "800000000"]),
            target: 1.02,
            versus_bpftrace: false,
            parts: false,
            min_rounds: 0,
        },
        OverheadCase {
            name: "syscall storm",
            args: s(&[
                "input",
                "--workers",
                "4",
                "--batches",
                "6000",
                "--reads",
                "64",
                "--read-kib",
                "4",
                "--decode-passes",
                "8",
                "--dir",
                &dir,
            ]),
            target: 1.03,
            versus_bpftrace: true,
            parts: false,
            min_rounds: 0,
        },
    ];
    // GAPSCOPE_BENCH_CASE=TEXT: only the overhead cases whose name has it.
    let only = std::env::var("GAPSCOPE_BENCH_CASE").ok();
    for case in cases
        .into_iter()
        .filter(|c| only.as_deref().is_none_or(|o| c.name.contains(o)))
    {
        let rounds = b.rounds.max(case.min_rounds);
        let mut peers: Vec<&Profiler> = all_peers.iter().collect();
        let parts = [
            Profiler {
                name: "gapscope --no-offcpu-stacks",
                run: gapscope_without_offcpu_stacks,
            },
            Profiler {
                name: "gapscope --freq 0",
                run: gapscope_without_samples,
            },
            Profiler {
                name: EMPTY_PROGRAMS,
                run: empty_programs,
            },
        ];
        if case.parts {
            peers.extend(&parts);
        }
        eprintln!("xtask: bench: overhead, {} ({rounds} rounds)", case.name);
        let mut cmd = vec![b.bin("gs-bench").to_str().unwrap().to_string()];
        cmd.extend(case.args.clone());
        cmd.push("--time-file".into());
        cmd.push(b.dir.join("time").to_str().unwrap().to_string());
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
        let mut cpu_ratio = Vec::new();
        let (mut bare_walls, mut bare_cpu) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Alternate: bare, then each profiler, each against that bare
            // run; the order of the profilers rotates between rounds.
            let (bw, bc) = timed(b, bare(b, round, &cmd))?;
            bare_walls.push(bw);
            bare_cpu.push(bc);
            for k in 0..peers.len() {
                let i = (k + round) % peers.len();
                let (w, c) = (peers[i].run)(b, round, &cmd)?;
                ratios[i].push(w / bw);
                if i == 0 {
                    cpu_ratio.push(c / bc);
                }
            }
        }
        let rec = report_json(b, &b.dir.join(format!("rec-{}", rounds - 1)))?;
        let session = &rec["session"];
        let own_cpu = session["collector_cpu_ns"].as_f64().unwrap_or(0.0);
        let own_rss = session["collector_peak_rss_bytes"].as_f64().unwrap_or(0.0);
        let duration = session["duration_ns"].as_f64().unwrap_or(1.0);
        // The default records no syscall one by one: count them where
        // every one was (the same work, so the same number).
        let all = report_json(b, &b.dir.join(format!("rec-all-{}", rounds - 1)))?;
        let all_duration = all["session"]["duration_ns"].as_f64().unwrap_or(1.0);
        let syscalls: f64 = all["threads"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .flat_map(|t| t["syscalls"].as_array().into_iter().flatten())
                    .map(|s| s["count"].as_f64().unwrap_or(0.0))
                    .sum()
            })
            .unwrap_or(0.0);
        let gs = median(ratios[0].clone());
        let others: Vec<String> = peers
            .iter()
            .zip(&ratios)
            .skip(1)
            .map(|(p, r)| format!("{} {:.3}×", p.name, median(r.clone())))
            .collect();
        let per_second = syscalls / (all_duration / 1e9);
        // A bare run strays this much from the next, and the placebo's
        // ratio from 1: ratios that differ by less are not told apart.
        let placebo = peers
            .iter()
            .zip(&ratios)
            .find(|(p, _)| p.name == BARE_AGAIN)
            .map_or(1.0, |(_, r)| median(r.clone()));
        let noise = spread(&bare_walls).max((placebo - 1.0).abs());
        // The job's own CPU time, BPF programs included (they run in its
        // context).
        let cpu = median(cpu_ratio);
        let mut measured = format!(
            "{gs:.3}× wall, {cpu:.3}× job CPU ({}; noise ±{:.1}%: bare runs' spread or the placebo's distance from 1) · {:.0}k syscalls/s · gapscope itself {:.1} ms CPU ({:.2}% of one CPU), {:.0} MiB peak",
            others.join(", "),
            noise * 100.0,
            per_second / 1e3,
            own_cpu / 1e6,
            own_cpu / duration * 100.0,
            own_rss / (1 << 20) as f64,
        );
        if case.parts {
            // The kernel's own count of each program's runs and their time
            // (bpf_stats_enabled), against the job's bare CPU time.
            match program_shares(b, &cmd, median(bare_cpu.clone())) {
                Ok(p) => measured.push_str(&format!(" · BPF programs, of the bare job's CPU: {p}")),
                Err(e) => eprintln!("xtask: bench: the BPF programs' own costs: {e:#}"),
            }
        }
        // Below bpftrace's figure in the same run, where it ran and the
        // case is one it is a peer in.
        let bpftrace = peers
            .iter()
            .zip(&ratios)
            .find(|(p, _)| case.versus_bpftrace && p.name == "bpftrace")
            .map(|(_, r)| median(r.clone()));
        let target = match bpftrace {
            Some(_) => format!("≤ {:.2}× wall and job CPU, and below bpftrace", case.target),
            None => format!("≤ {:.2}× wall and job CPU", case.target),
        };
        let cpu_noise = spread(&bare_cpu).max((placebo - 1.0).abs());
        // What hooking the tracepoints costs before any work is done.
        let floor = peers
            .iter()
            .zip(&ratios)
            .find(|(p, _)| p.name == EMPTY_PROGRAMS)
            .map(|(_, r)| median(r.clone()));
        let verdict = if gs > case.target + noise || cpu > case.target + cpu_noise {
            Verdict::Missed(match floor {
                Some(f) if f > case.target + noise => format!(
                    "programs that do nothing at the same tracepoints cost {f:.3}× here, more \
                     than the target allows any recorder hooked there; the rest is the \
                     scheduler programs' own work and the blocked-time stacks"
                ),
                _ => "the scheduler tracepoints, samples and blocked-time stacks, charged to the \
                      target; gapscope's own process is the small part"
                    .into(),
            })
        } else if bpftrace.is_some_and(|bt| gs > bt + noise) {
            Verdict::Missed(format!(
                "bpftrace, recording only a histogram, ran this case at {:.3}×",
                bpftrace.unwrap_or(0.0)
            ))
        } else {
            Verdict::Met
        };
        rows.push(Row {
            case: format!("overhead: {} (median of {rounds})", case.name),
            measured,
            target,
            verdict,
        });
    }
    Ok(())
}

/// Iterations of the bystander's loop: a quarter to half a second bare.
const BYSTANDER_ITERS: u64 = 2_000_000;
/// The bystander's calls: gs-bench's name, and as the table says it.
const BYSTANDER_CALLS: [(&str, &str); 2] =
    [("getppid", "getppid"), ("read", "1-byte read of /dev/zero")];
const BYSTANDER_TARGET: f64 = 1.01;

/// A recorder of a process other than the bystander: an idle `sleep`.
enum Elsewhere {
    /// `gapscope run` of a shell that says it has started, then execs sleep.
    Gapscope(Running),
    /// bpftrace, its program filtered to the pid of a sleep the bench
    /// started.
    Bpftrace { tracer: Bpftrace, _sleep: Running },
}

impl Elsewhere {
    /// `recorder`: "bpftrace", or "gapscope" and any options of `run`.
    fn start(b: &Bench, recorder: &str) -> Result<Elsewhere> {
        if recorder == "bpftrace" {
            let sleep = Running::spawn(Command::new("sleep").arg("3600"), libc::SIGKILL)?;
            let tracer = Bpftrace::start(b, &format!("pid == {}", sleep.pid()))?;
            return Ok(Elsewhere::Bpftrace {
                tracer,
                _sleep: sleep,
            });
        }
        // `run` releases its command only once the probes are attached, so
        // the ready file means recording.
        let ready = b.dir.join("other-ready");
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_dir_all(b.dir.join("other-rec"));
        let mut proc = Running::spawn(
            Command::new(b.bin("gapscope"))
                .args(["run", "-q", "--no-exports"])
                .args(recorder.split_whitespace().skip(1))
                .arg("-o")
                .arg(b.dir.join("other-rec"))
                .args(["--", "sh", "-c", ": > \"$1\"; exec sleep 3600", "sh"])
                .arg(&ready)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            // `run` passes it on to the sleep and ends when that exits.
            libc::SIGINT,
        )?;
        wait_until(&mut proc, "gapscope run", || ready.exists())?;
        Ok(Elsewhere::Gapscope(proc))
    }

    fn stop(self) -> Result<()> {
        match self {
            Elsewhere::Gapscope(proc) => {
                // It exits as its command did: killed by SIGINT, 130.
                let status = proc.stop()?;
                if !(status.success() || status.code() == Some(128 + libc::SIGINT)) {
                    bail!("gapscope run of the idle process failed ({status})");
                }
            }
            Elsewhere::Bpftrace { tracer, .. } => {
                tracer.stop()?;
            }
        }
        Ok(())
    }
}

/// The cost to processes nobody records: a loop of cheap syscalls, timed
/// from inside, bare and while gapscope (by default, then with `--syscalls
/// all`; bpftrace too where it works) records an idle process. The
/// target is judged on the default. Each pass runs every call on CPU 0 and on the
/// last CPU, since a recorder's cost can depend on the CPU.
fn bystander(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    // The default, and with every syscall hooked.
    let mut recorders = vec!["gapscope", "gapscope --syscalls all"];
    match bpftrace_usable() {
        Some(Ok(())) => recorders.push("bpftrace"),
        Some(Err(why)) => eprintln!(
            "xtask: bench: bpftrace is installed but cannot attach here ({why}); not compared"
        ),
        None => {}
    }
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpus: Vec<usize> = if ncpu > 1 { vec![0, ncpu - 1] } else { vec![0] };
    eprintln!(
        "xtask: bench: bystander ({} rounds, {} calls each on CPU {})",
        b.rounds,
        BYSTANDER_ITERS,
        cpus.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    // Wall ns of each call on each CPU: [call][cpu].
    type Walls = Vec<Vec<f64>>;
    let pass = || -> Result<Walls> {
        BYSTANDER_CALLS
            .iter()
            .map(|(call, _)| {
                cpus.iter()
                    .map(|cpu| {
                        let mut c = Command::new(b.bin("gs-bench"));
                        c.args(["syscalls", "--iters"])
                            .arg(BYSTANDER_ITERS.to_string())
                            .args(["--call", call, "--cpu"])
                            .arg(cpu.to_string())
                            .arg("--time-file")
                            .arg(b.dir.join("time"));
                        Ok(timed(b, c)?.0)
                    })
                    .collect()
            })
            .collect()
    };
    let mut bare_runs = Vec::new();
    let mut runs: Vec<Vec<Walls>> = vec![Vec::new(); recorders.len()];
    for round in 0..b.rounds {
        bare_runs.push(pass()?);
        for k in 0..recorders.len() {
            let i = (k + round) % recorders.len();
            let other = Elsewhere::start(b, recorders[i])?;
            let walls = pass();
            other.stop()?;
            runs[i].push(walls?);
        }
    }
    let _ = std::fs::remove_dir_all(b.dir.join("other-rec"));
    let per_call = |walls: &[Walls], call: usize| {
        median(
            walls
                .iter()
                .map(|w| w[call].iter().sum::<f64>() / (cpus.len() as u64 * BYSTANDER_ITERS) as f64)
                .collect(),
        )
    };
    // Per round: the recorded walls over the bare ones, all CPUs together;
    // ns added per syscall on each CPU, both calls together.
    let ratio = |i: usize, call: usize| {
        median(
            runs[i]
                .iter()
                .zip(&bare_runs)
                .map(|(r, bw)| r[call].iter().sum::<f64>() / bw[call].iter().sum::<f64>())
                .collect(),
        )
    };
    let added = |i: usize, call: usize| per_call(&runs[i], call) - per_call(&bare_runs, call);
    let added_on = |i: usize, cpu: usize| {
        median(
            runs[i]
                .iter()
                .zip(&bare_runs)
                .map(|(r, bw)| {
                    (0..BYSTANDER_CALLS.len())
                        .map(|c| r[c][cpu] - bw[c][cpu])
                        .sum::<f64>()
                        / (BYSTANDER_CALLS.len() as u64 * BYSTANDER_ITERS) as f64
                })
                .collect(),
        )
    };
    // One figure per call, named: "getppid …, 1-byte read … …".
    let each_call = |figure: &dyn Fn(usize, &str) -> String| {
        BYSTANDER_CALLS
            .iter()
            .enumerate()
            .map(|(c, (_, call))| figure(c, call))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ratios_of = |i: usize| each_call(&|c, call| format!("{call} {:.2}×", ratio(i, c)));
    let bare_line = each_call(&|c, call| format!("{call} {:.0} ns", per_call(&bare_runs, c)));
    let mut parts = vec![format!("bare {bare_line} per call")];
    for (i, name) in recorders.iter().enumerate() {
        let ratios = ratios_of(i);
        let by_cpu = cpus
            .iter()
            .enumerate()
            .map(|(k, cpu)| format!("{:+.0} ns on CPU {cpu}", added_on(i, k)))
            .collect::<Vec<_>>()
            .join(", ");
        parts.push(format!(
            "{name} recording an idle process: {ratios} ({by_cpu}, per syscall)"
        ));
    }
    let worst = (0..BYSTANDER_CALLS.len())
        .map(|c| ratio(0, c))
        .fold(0.0, f64::max);
    // How far one bare pass strays from the next, for the call that strays
    // most: ratios within it of the target are not told apart from it.
    let noise = (0..BYSTANDER_CALLS.len())
        .map(|c| {
            let sums: Vec<f64> = bare_runs.iter().map(|w| w[c].iter().sum()).collect();
            spread(&sums)
        })
        .fold(0.0, f64::max);
    parts.push(format!("bare passes stray ±{:.1}%", noise * 100.0));
    let verdict = if worst <= BYSTANDER_TARGET + noise {
        Verdict::Met
    } else {
        let each = each_call(&|c, call| format!("{:+.0} ns per {call}", added(0, c)));
        Verdict::Missed(format!(
            "a cost on every syscall of every process ({each}), though the default hooks no \
             syscall: the scheduler tracepoints fire for every task's switches, and a \
             syscall that blocks switches"
        ))
    };
    rows.push(Row {
        case: format!(
            "bystander: an untracked process's syscalls while another is recorded (median of {})",
            b.rounds
        ),
        measured: parts.join(" · "),
        target: format!("≤ {BYSTANDER_TARGET:.2}×"),
        verdict,
    });
    bystander_switches(b, rows)
}

/// The switch-heavy relay (three processes handing 4 KiB chunks over
/// pipes) on CPU `cpu`: its wall time, ns.
fn relay(b: &Bench, chunks: u32, cpu: usize) -> Result<f64> {
    relay_with(b, false, chunks, cpu)
}

/// The relay, under empty programs at gapscope's tracepoints when
/// `hooked`.
fn relay_with(b: &Bench, hooked: bool, chunks: u32, cpu: usize) -> Result<f64> {
    let mut c = match hooked {
        true => {
            let mut c = under_empty_programs(b);
            c.arg(b.bin("gs-bench"));
            c
        }
        false => Command::new(b.bin("gs-bench")),
    };
    c.args(["relay", "--chunks", &chunks.to_string(), "--read-kib", "4"])
        .args(["--decode-passes", "2", "--cpu"])
        .arg(cpu.to_string())
        .arg("--dir")
        .arg(&b.dir)
        .arg("--time-file")
        .arg(b.dir.join("time"));
    Ok(timed(b, c)?.0)
}

/// Rounds of the switch-heavy bystander at least (its wall time strays
/// more than the syscall loops').
const SWITCH_BYSTANDER_ROUNDS: usize = 9;

/// The scheduler tracepoints run at every context switch on the machine,
/// recorded or not: a switch-heavy process nobody records (the relay of
/// the overhead case, pinned to one CPU), bare and while gapscope records
/// an idle process, in alternating rounds.
fn bystander_switches(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let rounds = b.rounds.max(SWITCH_BYSTANDER_ROUNDS);
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    eprintln!("xtask: bench: bystander, switch-heavy ({rounds} rounds, on CPU {cpu})");
    let relay = || relay(b, 50_000, cpu);
    let (mut bare, mut recorded, mut again) = (Vec::new(), Vec::new(), Vec::new());
    let mut floor = Vec::new();
    for _ in 0..rounds {
        bare.push(relay()?);
        let other = Elsewhere::start(b, "gapscope")?;
        let wall = relay();
        other.stop()?;
        recorded.push(wall?);
        // A placebo: the bare job again, in its turn.
        again.push(relay()?);
        // The floor: programs that do nothing at the same tracepoints.
        floor.push(relay_with(b, true, 50_000, cpu)?);
    }
    let _ = std::fs::remove_dir_all(b.dir.join("other-rec"));
    let ratio = |v: &[f64]| median(v.iter().zip(&bare).map(|(r, b)| r / b).collect());
    let (got, placebo, floor) = (ratio(&recorded), ratio(&again), ratio(&floor));
    let noise = spread(&bare).max((placebo - 1.0).abs());
    rows.push(Row {
        case: format!(
            "bystander: an untracked switch-heavy pipeline while another process is recorded (median of {rounds})"
        ),
        measured: format!(
            "{got:.3}× wall (bare again {placebo:.3}×, {EMPTY_PROGRAMS} {floor:.3}×; noise ±{:.1}%) · bare {:.3} s",
            noise * 100.0,
            median(bare.clone()) / 1e9
        ),
        target: format!("≤ {BYSTANDER_TARGET:.2}×"),
        verdict: if got <= BYSTANDER_TARGET + noise {
            Verdict::Met
        } else if floor > BYSTANDER_TARGET + noise {
            Verdict::Missed(format!(
                "the scheduler tracepoints run at every context switch of every task, and \
                 programs that do nothing there cost {floor:.3}× here; above that, an untracked \
                 switch pays a read of the next task's ids, two loads of the tracked-process \
                 bitmap and its run's charge"
            ))
        } else {
            Verdict::Missed(
                "the scheduler tracepoints run at every context switch of every task: an \
                 untracked switch pays a read of the next task's ids, two loads of the tracked-process bitmap and its run's charge"
                    .into(),
            )
        },
    });
    Ok(())
}

/// gapscope, pinned to CPU 0 when taskset is there to do it.
fn gapscope_on_cpu0(b: &Bench, pin: bool) -> Command {
    if pin {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(b.bin("gapscope"));
        c
    } else {
        Command::new(b.bin("gapscope"))
    }
}

fn throughput(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!("xtask: bench: throughput");
    let pin = have("taskset");
    let mut best: Option<(f64, u64)> = None;
    let mut lines = Vec::new();
    for rate in [250_000u64, 500_000, 1_000_000, 2_000_000, 0] {
        let out = b.dir.join(format!("tp-{rate}"));
        let mut cmd = gapscope_on_cpu0(b, pin);
        cmd.args(["run", "-q", "--no-exports", "-o"])
            .arg(&out)
            .arg("--")
            .arg(b.bin("gs-bench"))
            .args([
                "events",
                "--threads",
                "1",
                "--secs",
                "2",
                "--cpu",
                "1",
                "--rate",
            ])
            .arg(rate.to_string());
        quiet(&mut cmd)?;
        let r = report_json(b, &out)?;
        let events = r["session"]["events"].as_f64().unwrap_or(0.0);
        let secs = r["session"]["duration_ns"].as_f64().unwrap_or(1.0) / 1e9;
        let drops = r["drops"]["cpu_events"].as_u64().unwrap_or(0);
        let rate_got = events / secs;
        lines.push(format!(
            "{}: {:.2} M/s, {drops} dropped",
            if rate == 0 {
                "max".to_string()
            } else {
                format!("{:.2} M", rate as f64 / 1e6)
            },
            rate_got / 1e6
        ));
        if drops == 0 && best.is_none_or(|(r, _)| rate_got > r) {
            best = Some((rate_got, drops));
        }
    }
    let best_rate = best.map(|b| b.0).unwrap_or(0.0);
    rows.push(Row {
        case: "throughput: events recorded, zero drops".into(),
        measured: format!(
            "{:.2} M events/s (generator on CPU 1{}; offered → recorded: {})",
            best_rate / 1e6,
            if pin { ", gapscope on CPU 0" } else { "" },
            lines.join(" · ")
        ),
        target: "≥ 1 M events/s on one core".into(),
        verdict: if best_rate >= 1e6 {
            Verdict::Met
        } else {
            Verdict::Missed("the reader's per-event decode and write".into())
        },
    });

    // Above what it can take: a 1 MiB ring, and two generator threads at a
    // higher priority on gapscope's own CPU, so its reader falls behind.
    // Drops must be counted, the run must end normally and the session
    // must read back.
    let out = b.dir.join("tp-overload");
    let mut cmd = gapscope_on_cpu0(b, pin);
    quiet(
        cmd.args(["run", "-q", "--no-exports", "--buffer-mb", "1", "-o"])
            .arg(&out)
            .arg("--")
            .arg(b.bin("gs-bench"))
            .args([
                "events",
                "--threads",
                "2",
                "--secs",
                "2",
                "--cpu",
                "0",
                "--nice",
                "-20",
            ]),
    )?;
    let r = report_json(b, &out)?;
    let drops = r["drops"]["cpu_events"].as_u64().unwrap_or(0);
    let events = r["session"]["events"].as_u64().unwrap_or(0);
    rows.push(Row {
        case: "throughput: overload (1 MiB ring, reader starved)".into(),
        measured: format!(
            "{events} events recorded, {drops} dropped and counted ({:.1}%); exit 0, session reads back",
            drops as f64 * 100.0 / (events + drops).max(1) as f64
        ),
        target: "drops counted, never a crash".into(),
        verdict: if drops > 0 {
            Verdict::Met
        } else {
            Verdict::Missed("no drops could be provoked: the reader kept up".into())
        },
    });
    Ok(())
}

/// The offline cases, in events. Those from `OFFLINE_GUARDED` up run only
/// when the peak RSS projected from the case before them (as if it grew
/// with the recording) fits in half of MemAvailable and the disk has room
/// for the file: 300 M events (hours of a busy job) take ~2 GiB on disk.
const OFFLINE_EVENTS: [u64; 4] = [1_000_000, 10_000_000, 40_000_000, 300_000_000];
const OFFLINE_GUARDED: u64 = 40_000_000;
const OFFLINE_TARGET: &str = "≥ 10 M events/s";
/// Memory flat in the recording's length: the two cases compared, and the
/// bound on their peaks' ratio; and the most a report may take at the
/// largest case.
const FLAT_CASES: (u64, u64) = (10_000_000, 40_000_000);
const FLAT_RATIO: f64 = 1.3;
const LARGEST_PEAK: u64 = 1 << 30;

/// What one offline case measured, for projecting the next.
struct OfflineRun {
    events: u64,
    rss: u64,
    size: u64,
}

/// What gs-synth says it wrote.
struct Synth {
    events: u64,
    gpu_records: u64,
}

/// The number just before `label` in `line`.
fn count_before(line: &str, label: &str) -> Option<u64> {
    let head = &line[..line.find(label)?];
    head.rsplit(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// Writes a synthetic session of `n` events; its counts from gs-synth's
/// last line (`gs-synth: N events: C CPU events, G GPU records (…) in …`).
fn synth(b: &Bench, path: &Path, n: u64) -> Result<Synth> {
    let mut cmd = Command::new(b.bin("gs-synth"));
    cmd.arg(path).arg(n.to_string());
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| describe(&cmd))?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{} failed: {}", describe(&cmd), text.trim());
    }
    let line = text.lines().last().unwrap_or_default();
    match (
        count_before(line, " events:"),
        count_before(line, " GPU records"),
    ) {
        (Some(events), Some(gpu_records)) => Ok(Synth {
            events,
            gpu_records,
        }),
        _ => bail!("gs-synth: no counts in {line:?}"),
    }
}

/// A field of /proc/meminfo, in bytes.
fn meminfo(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// Bytes an unprivileged writer can still put on the file system of `dir`.
fn disk_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is valid; statvfs fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// Why a case of `n` events should not run here, projected linearly from
/// the case before it; None when it fits.
fn offline_refusal(b: &Bench, n: u64, before: Option<&OfflineRun>) -> Option<String> {
    let Some(before) = before else {
        return Some("not run: no smaller case measured to project its peak from".into());
    };
    let scale = n as f64 / before.events as f64;
    let peak = before.rss as f64 * scale;
    let file = before.size as f64 * scale;
    let basis = format!(
        "{:.2} GiB at {:.0}M events × {scale:.1}",
        gib(before.rss as f64),
        before.events as f64 / 1e6
    );
    let mut why = Vec::new();
    match meminfo("MemAvailable") {
        Some(avail) if peak <= avail as f64 / 2.0 => {}
        Some(avail) => why.push(format!(
            "projected {:.1} GiB peak ({basis}), {:.1} GiB available (MemAvailable; it runs \
             when the projection fits in half)",
            gib(peak),
            gib(avail as f64)
        )),
        None => why.push("no MemAvailable in /proc/meminfo to check its projected peak".into()),
    }
    // The file, and as much again for the file system's slack and whatever
    // else is writing there.
    match disk_free(&b.dir) {
        Some(free) if 2.0 * file <= free as f64 => {}
        Some(free) => why.push(format!(
            "projected {:.2} GiB file, {:.2} GiB free under {} (it runs with twice the file free)",
            gib(file),
            gib(free as f64),
            b.dir.display()
        )),
        None => why.push(format!("free space under {} unknown", b.dir.display())),
    }
    (!why.is_empty()).then(|| format!("not run: {}", why.join("; ")))
}

fn offline(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let mut before: Option<OfflineRun> = None;
    let mut peaks: Vec<(u64, u64)> = Vec::new();
    for n in OFFLINE_EVENTS {
        let case = format!("offline: report of a {}M-event session", n / 1_000_000);
        let guarded = n >= OFFLINE_GUARDED;
        if guarded {
            if let Some(why) = offline_refusal(b, n, before.as_ref()) {
                eprintln!("xtask: bench: offline, {n} events: {why}");
                rows.push(Row {
                    case,
                    measured: why,
                    target: OFFLINE_TARGET.into(),
                    verdict: Verdict::NotRun,
                });
                continue;
            }
        }
        eprintln!("xtask: bench: offline, {n} events");
        let path = b.dir.join(format!("synthetic-{n}.gsz"));
        let result = offline_case(b, &path, &case, n);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("json"));
        match result {
            Ok((row, run)) => {
                rows.push(row);
                peaks.push((n, run.rss));
                before = Some(run);
            }
            // The projection was wrong (or the OOM killer disagreed): the
            // row says so and the rest of the bench goes on.
            Err(e) if guarded => rows.push(Row {
                case,
                measured: format!("failed: {e:#}"),
                target: OFFLINE_TARGET.into(),
                verdict: Verdict::Missed("the report did not complete".into()),
            }),
            Err(e) => return Err(e),
        }
    }
    rows.push(memory_flat(&peaks));
    Ok(())
}

/// Whether the report's peak memory stays flat as the recording grows,
/// from the cases' peaks (events, bytes).
fn memory_flat(peaks: &[(u64, u64)]) -> Row {
    let peak = |n: u64| peaks.iter().find(|p| p.0 == n).map(|p| p.1);
    let (small, large) = FLAT_CASES;
    let largest = OFFLINE_EVENTS[OFFLINE_EVENTS.len() - 1];
    let target = format!(
        "peak at {}M ≤ {FLAT_RATIO}× the peak at {}M · under {} MiB at {}M",
        large / 1_000_000,
        small / 1_000_000,
        LARGEST_PEAK >> 20,
        largest / 1_000_000
    );
    let case = "offline: memory in the recording's length".to_string();
    let (Some(a), Some(z)) = (peak(small), peak(large)) else {
        return Row {
            case,
            measured: format!(
                "not run: the {}M and {}M cases are both needed",
                small / 1_000_000,
                large / 1_000_000
            ),
            target,
            verdict: Verdict::NotRun,
        };
    };
    let ratio = z as f64 / a as f64;
    let mut measured = format!(
        "{}M: {} MiB, {}M: {} MiB ({ratio:.2}×)",
        small / 1_000_000,
        a >> 20,
        large / 1_000_000,
        z >> 20
    );
    let mut missed = Vec::new();
    if ratio > FLAT_RATIO {
        missed.push("what the report holds grows with the recording (see the offline cases)");
    }
    match peak(largest) {
        Some(p) => {
            measured += &format!(", {}M: {} MiB", largest / 1_000_000, p >> 20);
            if p > LARGEST_PEAK {
                missed.push("over the bound at the largest case");
            }
        }
        None => missed.push("the largest case did not run here (its projected peak)"),
    }
    Row {
        case,
        measured,
        target,
        verdict: if missed.is_empty() {
            Verdict::Met
        } else {
            Verdict::Missed(missed.join("; "))
        },
    }
}

fn offline_case(b: &Bench, path: &Path, case: &str, n: u64) -> Result<(Row, OfflineRun)> {
    let made = synth(b, path, n)?;
    let size = std::fs::metadata(path)?.len();
    let json = path.with_extension("json");
    let said = path.with_extension("phases");
    let (secs, rss) = measure_into(
        Command::new(b.bin("gapscope"))
            .args(["report", "--format", "json"])
            .arg(path)
            .env("GAPSCOPE_PHASES", "1")
            .stderr(std::fs::File::create(&said)?),
        std::fs::File::create(&json)?.into(),
    )?;
    let phases = phases(&std::fs::read_to_string(&said).unwrap_or_default());
    let _ = std::fs::remove_file(&said);
    // The report's own count of CPU events read, against what was written.
    let report: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let read = report["session"]["events"].as_u64();
    let cpu_events = made.events - made.gpu_records;
    if read != Some(cpu_events) {
        bail!(
            "{}: the report read {read:?} CPU events, gs-synth wrote {cpu_events}",
            path.display()
        );
    }
    let events = made.events;
    let rate = events as f64 / secs;
    let mem = rss as f64 / size as f64;
    let mut missed = Vec::new();
    if rate < 10e6 {
        missed.push(
            "speed: the events are decoded twice (the first pass measures their order and \
             reads the symbols the attribution needs), then each event through its thread's \
             state machine and the attribution; the what-if replays walk the run once per core",
        );
    }
    let row = Row {
        case: case.into(),
        measured: format!(
            "{secs:.2} s = {:.1} M events/s ({phases}) · peak RSS {} MiB = {mem:.1}× the file ({} MiB, \
             {:.1} B/event) · {:.2} M CPU events + {:.2} M GPU records",
            rate / 1e6,
            rss >> 20,
            size >> 20,
            size as f64 / events as f64,
            cpu_events as f64 / 1e6,
            made.gpu_records as f64 / 1e6
        ),
        target: OFFLINE_TARGET.into(),
        verdict: if missed.is_empty() {
            Verdict::Met
        } else {
            Verdict::Missed(missed.join("; "))
        },
    };
    Ok((row, OfflineRun { events, rss, size }))
}

/// Where a report's time went, from what it said with `GAPSCOPE_PHASES`
/// set (`gapscope: phase NAME (WHAT): SECONDS s (peak N MiB)`): "NAME
/// SECONDS s (peak N MiB)", joined.
fn phases(said: &str) -> String {
    said.lines()
        .filter_map(|l| l.strip_prefix("gapscope: phase "))
        .filter_map(|l| {
            let (name, took) = l.split_once("): ")?;
            let name = name.split(" (").next().unwrap_or(name);
            Some(format!("{name} {took}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A Python-heavy job: `leaf` 31 Python frames deep, for a fixed amount of
/// work (about two CPU-seconds here), beside a thread that sleeps a
/// millisecond 1000 times (each sleep an off-CPU stack to walk). It times
/// itself into argv[1].
const PYTHON_JOB: &str = "import sys, threading, time
def leaf(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x
def depth(d, n):
    return leaf(n) if d == 0 else depth(d - 1, n)
def sleeper(k):
    for _ in range(k):
        time.sleep(0.001)
t0, c0 = time.perf_counter_ns(), time.process_time_ns()
th = threading.Thread(target=sleeper, args=(1000,))
th.start()
for _ in range(700):
    depth(30, 30000)
th.join()
open(sys.argv[1], 'w').write('%d %d' % (time.perf_counter_ns() - t0, time.process_time_ns() - c0))
";

/// What walking CPython's frames costs the job, against recording without
/// them and against CPython's own perf trampoline, and what each names —
/// on the CPython setup built with frame pointers, the one kind the
/// trampoline works on.
fn python(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let python = root().join("target/python3.13/bin/python3.13");
    if !python.exists() {
        rows.push(Row {
            case: "Python frames".into(),
            measured: format!("{} is not built (cargo xtask setup)", python.display()),
            target: String::new(),
            verdict: Verdict::NotRun,
        });
        return Ok(());
    }
    let script = b.dir.join("job.py");
    std::fs::write(&script, PYTHON_JOB)?;
    let cmd: Vec<String> = vec![
        python.display().to_string(),
        script.display().to_string(),
        b.dir.join("time").display().to_string(),
    ];
    eprintln!("xtask: bench: Python frames ({} rounds)", b.rounds);
    let trampoline = |mut c: Command| {
        c.env("PYTHONPERFSUPPORT", "1");
        c
    };
    let (mut unwinder, mut without, mut tramp) = (Vec::new(), Vec::new(), Vec::new());
    let (mut unwinder_cpu, mut bare_walls) = (Vec::new(), Vec::new());
    for round in 0..b.rounds {
        let (bw, bc) = timed(b, bare(b, round, &cmd))?;
        bare_walls.push(bw);
        let (w, c) = timed(
            b,
            under_gapscope(b, &["--no-exports"], format!("py-{round}"), &cmd),
        )?;
        unwinder.push(w / bw);
        unwinder_cpu.push(c / bc);
        let (w, _) = timed(
            b,
            under_gapscope(
                b,
                &["--no-exports", "--no-python-frames"],
                format!("py-off-{round}"),
                &cmd,
            ),
        )?;
        without.push(w / bw);
        let (w, _) = timed(b, trampoline(bare(b, round, &cmd)))?;
        tramp.push(w / bw);
    }
    // What each names: the share of the job's samples with `leaf` under
    // `depth`, walked by the unwinder, and by the trampoline alone.
    let (_, _) = timed(
        b,
        trampoline(under_gapscope(
            b,
            &["--no-exports", "--no-python-frames"],
            "py-tramp".into(),
            &cmd,
        )),
    )?;
    let named = |rec: &str| -> Result<f64> {
        let folded = b.dir.join(format!("{rec}.folded"));
        quiet(
            Command::new(b.bin("gapscope"))
                .arg("export")
                .arg(b.dir.join(rec))
                .args(["--flamegraph", "cpu", "--folded", "-o"])
                .arg(&folded),
        )?;
        let (mut with, mut all) = (0u64, 0u64);
        for line in std::fs::read_to_string(&folded)?.lines() {
            let Some((stack, n)) = line.rsplit_once(' ') else {
                continue;
            };
            if !stack.starts_with("python3.13") {
                continue;
            }
            let n: u64 = n.parse().unwrap_or(0);
            all += n;
            let depth = stack.find("py::depth");
            let leaf = stack.find("py::leaf");
            if matches!((depth, leaf), (Some(d), Some(l)) if d < l) {
                with += n;
            }
        }
        Ok(with as f64 / all.max(1) as f64)
    };
    let by_unwinder = named(&format!("py-{}", b.rounds - 1))?;
    let by_trampoline = named("py-tramp")?;
    // Per capture, as the kernel times each run of a program.
    let with_costs = program_costs(under_gapscope(
        b,
        &["--no-exports"],
        "py-costs".into(),
        &cmd,
    ))?;
    let without_costs = program_costs(under_gapscope(
        b,
        &["--no-exports", "--no-python-frames"],
        "py-costs-off".into(),
        &cmd,
    ))?;
    let per_run = |costs: &HashMap<String, (u64, u64)>, prog: &str| {
        costs
            .get(prog)
            .filter(|c| c.1 > 0)
            .map_or("?".to_string(), |c| {
                format!("{:.1} µs", c.0 as f64 / c.1 as f64 / 1e3)
            })
    };
    let costs = format!(
        "per run of the cpu-clock sample program {} with the unwinder, {} without; of the \
         context-switch program (which takes the blocked-time stacks) {} with, {} without",
        per_run(&with_costs, "gs_sample"),
        per_run(&without_costs, "gs_sample"),
        per_run(&with_costs, "gs_sched_switch"),
        per_run(&without_costs, "gs_sched_switch"),
    );
    let (u, w, t) = (median(unwinder), median(without), median(tramp));
    let noise = spread(&bare_walls);
    rows.push(Row {
        case: format!("Python frames (median of {})", b.rounds),
        measured: format!(
            "recorded with the unwinder {u:.3}× wall, {:.3}× job CPU · without it {w:.3}× · \
             (bare, not recorded) CPython's perf trampoline alone {t:.3}× · noise ±{:.1}% · \
             samples naming leaf under depth, 31 frames deep: unwinder {:.0}%, trampoline {:.0}% \
             (it needs an interpreter built with frame pointers; the unwinder does not) · {costs}",
            median(unwinder_cpu),
            noise * 100.0,
            by_unwinder * 100.0,
            by_trampoline * 100.0
        ),
        target: "≤ 1.01× wall with the unwinder".into(),
        verdict: if u > 1.01 + noise {
            Verdict::Missed(
                "each sample and each blocked-time stack walks the thread's Python frames, \
                 reading the interpreter's memory frame by frame"
                    .into(),
            )
        } else {
            Verdict::Met
        },
    });
    Ok(())
}

/// Runs `cmd` (a gapscope recording) with the kernel's BPF run-time
/// statistics on, and returns, for each BPF program, the time its runs
/// took and their count, as last read while it was loaded.
fn program_costs(mut cmd: Command) -> Result<HashMap<String, (u64, u64)>> {
    const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let before = std::fs::read_to_string(STATS)?;
    std::fs::write(STATS, "1")?;
    let mut child = cmd.stdout(Stdio::null()).spawn()?;
    let mut last = HashMap::new();
    while child.try_wait()?.is_none() {
        // Each program as last seen: they go one by one as gapscope ends.
        last.extend(bpf_programs());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(STATS, before.trim())?;
    Ok(last)
}

/// Every loaded BPF program's name, run time (ns) and run count.
fn bpf_programs() -> HashMap<String, (u64, u64)> {
    // bpf(2) commands and the layout of the attributes they take
    // (include/uapi/linux/bpf.h).
    const PROG_GET_NEXT_ID: libc::c_long = 11;
    const PROG_GET_FD_BY_ID: libc::c_long = 13;
    const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let bpf = |cmd: libc::c_long, attr: &mut [u8; 16]| -> libc::c_long {
        // SAFETY: attr is a live 16-byte buffer, large enough for these
        // commands' attributes.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
    };
    let mut out = HashMap::new();
    let mut id = 0u32;
    loop {
        let mut attr = [0u8; 16];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        if bpf(PROG_GET_NEXT_ID, &mut attr) != 0 {
            break;
        }
        id = u32::from_ne_bytes(attr[4..8].try_into().unwrap());
        let mut attr = [0u8; 16];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        let fd = bpf(PROG_GET_FD_BY_ID, &mut attr);
        if fd < 0 {
            continue;
        }
        // struct bpf_prog_info: name at 64, run_time_ns at 192, run_cnt at 200.
        let mut info = [0u8; 256];
        let mut attr = [0u8; 16];
        attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        let ok = bpf(OBJ_GET_INFO_BY_FD, &mut attr) == 0;
        // SAFETY: closing the fd bpf(2) just gave us.
        unsafe { libc::close(fd as i32) };
        if !ok {
            continue;
        }
        let name = &info[64..80];
        let name =
            String::from_utf8_lossy(&name[..name.iter().position(|&c| c == 0).unwrap_or(16)])
                .into_owned();
        let word = |at: usize| u64::from_ne_bytes(info[at..at + 8].try_into().unwrap());
        out.insert(name, (word(192), word(200)));
    }
    out
}

fn kineto(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!("xtask: bench: Kineto import");
    // A generated 200 MB trace, against reading the same bytes (the floor
    // any parser pays) measured in the same run.
    let trace = b.dir.join("synthetic-200MB.json");
    let size = generate_kineto(&trace, 200)?;
    let (read_s, _) = measure(Command::new("cat").arg(&trace))?;
    let (s, rss) = measure(
        Command::new(b.bin("gapscope"))
            .args(["report", "--format", "json"])
            .arg(&trace),
    )?;
    rows.push(Row {
        case: "Kineto: report of a 200 MB trace".into(),
        measured: format!(
            "{s:.2} s ({:.0} MB/s; reading the file alone {read_s:.2} s) · peak RSS {} MiB = {:.2}× the file",
            size as f64 / s / 1e6,
            rss >> 20,
            rss as f64 / size as f64
        ),
        target: "—".into(),
        verdict: Verdict::Info,
    });
    let _ = std::fs::remove_file(&trace);
    Ok(())
}

/// A synthetic PyTorch profiler trace of about `mib` MiB: steps of CPU ops,
/// runtime launches and the kernels they launch, with ns-resolution µs text.
fn generate_kineto(path: &Path, mib: u64) -> Result<u64> {
    use std::io::Write;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    write!(w, "{{\"schemaVersion\": 1, \"deviceProperties\": [{{\"id\": 0, \"name\": \"Synthetic GPU\"}}],\n\"traceEvents\": [\n")?;
    let mut bytes = 0u64;
    let mut ts_ns: u64 = 1_700_000_000_000_000_000;
    let mut corr = 0u64;
    let mut first = true;
    let target = mib << 20;
    while bytes < target {
        corr += 1;
        let us = |ns: u64| format!("{}.{:03}", ns / 1000, ns % 1000);
        let events = [
            format!("{{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::linear\", \"pid\": 100, \"tid\": 100, \"ts\": {}, \"dur\": 12.345, \"args\": {{\"External id\": {corr}}}}}", us(ts_ns)),
            format!("{{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 100, \"tid\": 100, \"ts\": {}, \"dur\": 4.100, \"args\": {{\"cbid\": 211, \"correlation\": {corr}}}}}", us(ts_ns + 2_000)),
            format!("{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"void gemm_kernel<float, 128, 64>(float const*, float*)\", \"pid\": 0, \"tid\": 7, \"ts\": {}, \"dur\": 9.875, \"args\": {{\"device\": 0, \"stream\": 7, \"correlation\": {corr}, \"grid\": [128, 1, 1], \"block\": [256, 1, 1]}}}}", us(ts_ns + 8_000)),
        ];
        for e in events {
            if !first {
                w.write_all(b",\n")?;
            }
            first = false;
            w.write_all(e.as_bytes())?;
            bytes += e.len() as u64 + 2;
        }
        ts_ns += 15_000;
    }
    write!(w, "\n]}}\n")?;
    w.flush()?;
    Ok(std::fs::metadata(path)?.len())
}

/// The agent's metrics page, when it answers.
fn agent_metrics(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

/// An unlabelled sample's value in a metrics page.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A process's peak resident memory, from /proc (VmHWM).
fn peak_rss(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// What `gapscope agent` costs: a fixed-work job (simtrain, sync-bound,
/// its simulated GPU dormant until the agent finds it) timed alone and
/// while the agent watches it, alternating; the agent's own CPU while
/// watching, from its /metrics; its peak memory.
fn agent(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let data = b.dir.join("simtrain-data");
    quiet(
        Command::new(b.bin("simtrain"))
            .arg("--prepare")
            .arg("--data")
            .arg(&data),
    )?;
    let job = || {
        let mut c = Command::new(b.bin("simtrain"));
        // ~19 s: two of the agent's 10-second windows.
        c.args(["--bottleneck", "sync", "--steps", "1200", "--data"])
            .arg(&data)
            .arg("--ground-truth")
            .arg(b.dir.join("agent-truth.json"))
            .stderr(Stdio::null());
        c
    };
    eprintln!("xtask: bench: agent ({} rounds)", b.rounds);
    let (mut ratios, mut cpus, mut peaks) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..b.rounds {
        let bare = measure(&mut job())?.0;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut agent = Running::spawn(
            Command::new(b.bin("gapscope"))
                .args(["agent", "--listen", &addr, "--dir"])
                .arg(b.dir.join(format!("agent-{round}")))
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            libc::SIGTERM,
        )?;
        wait_until(&mut agent, "gapscope agent", || {
            agent_metrics(&addr).is_some()
        })?;
        let cpu_at = |text: &str| sample(text, "gapscope_agent_cpu_seconds_total").unwrap_or(0.0);
        let before = cpu_at(&agent_metrics(&addr).context("the agent's metrics")?);
        let started = Instant::now();
        let watched = measure(&mut job())?.0;
        let after = cpu_at(&agent_metrics(&addr).context("the agent's metrics")?);
        let secs = started.elapsed().as_secs_f64();
        peaks.push(peak_rss(agent.pid()).unwrap_or(0) as f64);
        agent.stop()?;
        ratios.push(watched / bare);
        cpus.push((after - before) / secs);
    }
    let ratio = median(ratios.clone());
    rows.push(Row {
        case: "agent: a watched job's wall time".into(),
        measured: format!(
            "{ratio:.3}x its time alone (median of {}, spread {:.3})",
            ratios.len(),
            spread(&ratios)
        ),
        target: "≤ 1.03x".into(),
        verdict: if ratio <= 1.03 {
            Verdict::Met
        } else {
            Verdict::Missed(
                "the agent analyses each window on the job's machine while it runs".into(),
            )
        },
    });
    let cpu = median(cpus);
    rows.push(Row {
        case: "agent: its own CPU while watching one job".into(),
        measured: format!(
            "{:.1}% of one CPU (10-second windows, the default)",
            cpu * 100.0
        ),
        target: "≤ 5% of one CPU".into(),
        verdict: if cpu <= 0.05 {
            Verdict::Met
        } else {
            Verdict::Missed(
                "recording and analysing every window (the BPF programs are loaded once for the node)"
                    .into(),
            )
        },
    });
    rows.push(Row {
        case: "agent: peak memory".into(),
        measured: format!("{:.0} MiB", median(peaks) / (1 << 20) as f64),
        target: "flat: counters only".into(),
        verdict: Verdict::Info,
    });
    agent_jobs(b, rows)
}

/// Jobs the agent follows at once in the sweep.
const AGENT_JOBS: [usize; 3] = [1, 4, 8];

/// What the agent costs as it follows more jobs (one set of programs for
/// the node): N jobs that switch often without forking (a Python sleeping
/// 10 ms in a loop: 100 switches a second each), the agent following them
/// by pid in 5-second windows; its CPU over ten seconds or more, from its
/// /metrics, while an untracked switch-heavy neighbour (the relay) runs
/// again and again beside it, against the neighbour bare in the same run.
fn agent_jobs(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let relay = || relay(b, 30_000, cpu);
    let mut measured = Vec::new();
    for n in AGENT_JOBS {
        eprintln!("xtask: bench: agent following {n} jobs");
        let jobs: Vec<std::process::Child> = (0..n)
            .map(|_| {
                Command::new("python3")
                    .args(["-c", "import time\nwhile True: time.sleep(0.01)"])
                    .stdout(Stdio::null())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        let bare = relay()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(b.bin("gapscope"));
        cmd.args(["agent", "--listen", &addr, "--window", "5", "--dir"])
            .arg(b.dir.join(format!("agent-jobs-{n}")))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for j in &jobs {
            cmd.args(["--pid", &j.id().to_string()]);
        }
        let mut agent = Running::spawn(&mut cmd, libc::SIGTERM)?;
        wait_until(&mut agent, "gapscope agent", || {
            agent_metrics(&addr).is_some()
        })?;
        // Every job followed and a window behind it.
        std::thread::sleep(std::time::Duration::from_secs(3));
        let cpu_at = |text: &str| sample(text, "gapscope_agent_cpu_seconds_total").unwrap_or(0.0);
        let before = cpu_at(&agent_metrics(&addr).context("the agent's metrics")?);
        let started = Instant::now();
        let mut beside = Vec::new();
        while started.elapsed() < std::time::Duration::from_secs(10) {
            beside.push(relay());
        }
        let after = cpu_at(&agent_metrics(&addr).context("the agent's metrics")?);
        let secs = started.elapsed().as_secs_f64();
        agent.stop()?;
        for mut j in jobs {
            let _ = j.kill();
            let _ = j.wait();
        }
        let _ = std::fs::remove_dir_all(b.dir.join(format!("agent-jobs-{n}")));
        let beside = beside.into_iter().collect::<Result<Vec<f64>>>()?;
        let bare_again = relay()?;
        measured.push((
            n,
            (after - before) / secs,
            median(beside) / bare.min(bare_again),
        ));
    }
    let text: Vec<String> = measured
        .iter()
        .map(|(n, cpu, r)| {
            format!(
                "{n} jobs: {:.1}% of one CPU, neighbour {r:.3}×",
                cpu * 100.0
            )
        })
        .collect();
    let worst_cpu = measured.iter().map(|m| m.1).fold(0.0, f64::max);
    let worst = measured.iter().map(|m| m.2).fold(0.0, f64::max);
    rows.push(Row {
        case: "agent: following 1, 4 and 8 jobs (5-second windows)".into(),
        measured: text.join(" · "),
        target: "≤ 2% of one CPU and ≤ 1.01× for an untracked neighbour, at every count".into(),
        verdict: if worst_cpu <= 0.02 && worst <= 1.01 {
            Verdict::Met
        } else {
            Verdict::Missed(
                "each job's windows are cut, sealed and analysed on the node (the programs \
                 are loaded once for all of them); the neighbour pays the scheduler \
                 tracepoints whatever the count"
                    .into(),
            )
        },
    });
    Ok(())
}

/// The cases, in the order they run; `cargo xtask bench CASE…` runs only
/// those named.
const CASES: [&str; 7] = [
    "overhead",
    "bystander",
    "throughput",
    "python",
    "offline",
    "kineto",
    "agent",
];

pub fn bench(args: &[String]) -> Result<()> {
    if let Some(bad) = args.iter().find(|a| !CASES.contains(&a.as_str())) {
        bail!(
            "unknown bench case {bad:?}: cargo xtask bench [{}]…",
            CASES.join("|")
        );
    }
    let run = |case: &str| args.is_empty() || args.iter().any(|a| a == case);
    if (run("overhead") || run("bystander") || run("throughput") || run("python") || run("agent"))
        && !is_root()
    {
        bail!(
            "the overhead, bystander, throughput, python and agent cases record with eBPF: sudo -E cargo xtask bench \
             (`cargo xtask bench offline kineto` needs no root)"
        );
    }
    setup(false)?;
    let b = Bench {
        release: build_release()?,
        dir: root().join("target/bench"),
        rounds: std::env::var("GAPSCOPE_BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(ROUNDS)
            .max(1),
    };
    let _ = std::fs::remove_dir_all(&b.dir);
    std::fs::create_dir_all(&b.dir)?;
    let started = Instant::now();
    let mut rows = Vec::new();
    type Case = fn(&Bench, &mut Vec<Row>) -> Result<()>;
    let cases: [Case; 7] = [
        overhead, bystander, throughput, python, offline, kineto, agent,
    ];
    for (name, case) in CASES.iter().zip(cases) {
        if run(name) {
            case(&b, &mut rows)?;
        }
    }

    let only = if args.is_empty() {
        String::new()
    } else {
        format!(" · only {}", args.join(", "))
    };
    println!("gapscope bench · {}{only}", machine());
    for r in &rows {
        let mark = match &r.verdict {
            Verdict::Met => "MET",
            Verdict::Missed(_) => "NOT MET",
            Verdict::Info => "",
            Verdict::NotRun => "NOT RUN",
        };
        println!("\n{}  [{}]  {mark}", r.case, r.target);
        println!("  {}", r.measured);
        if let Verdict::Missed(why) = &r.verdict {
            println!("  bound by: {why}");
        }
    }
    println!("\n(took {:.0} s)", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&b.dir);
    Ok(())
}
