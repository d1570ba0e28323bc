//! `cargo xtask stress [N] [TEST...]`: the tests that hold gapscope to a ground truth
//! run beside N busy-looping processes (default 2) and an I/O-heavy
//! neighbour (a file written and read back with direct I/O, over and over),
//! as a node that runs training jobs is busy: the suite's rule that every
//! test passes on a loaded 2-core machine, checked.
//!
//! The neighbour's disk load is steady, not in bursts: the tests compare a
//! recording with another run of the job, and a neighbour that wrote 128 MiB
//! into the page cache and then flushed it at once (fsync) gave the two runs
//! different disks — a loader's 1 MiB direct reads took 20 ms each through
//! a 7-s recording that met several flushes, under 12 ms in its 0.7-s fixed
//! run that met none, and the prediction missed by 48-70% for it. Direct
//! I/O keeps one request of the neighbour's in the disk's queue all the
//! time. Each test binary's verdict
//! is reported with the lines it printed comparing itself with its truth
//! (the numbers that move under load). TEST names some of the binaries
//! (`agent recording`) where a change touched only their part. Not part of
//! `test`: it would double CI's time.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

use super::{cargo, root, run, setup};

/// The end-to-end tests that compare against a ground truth.
const TESTS: &[&str] = &[
    "diagnosis",
    "whatif",
    "dataloader",
    "distributed",
    "serving",
    "agent",
    "recording",
];

/// Words of the lines a test prints when it compares itself with its
/// truth.
const NUMBERS: &[&str] = &["truth", "predicted", "saw ", "scraped", "worker", "rank "];

/// The neighbours, each its own process group, killed with it when dropped.
struct Neighbours(Vec<Child>);

impl Neighbours {
    fn start(busy: usize) -> Result<Neighbours> {
        let scratch = root().join("target/stress-io");
        std::fs::create_dir_all(&scratch)?;
        let io = format!(
            "while :; do dd if=/dev/zero of={f} bs=1M count=128 oflag=direct 2>/dev/null; \
             dd if={f} of=/dev/null bs=1M iflag=direct 2>/dev/null; done",
            f = scratch.join("neighbour.bin").display()
        );
        let mut scripts = vec!["while :; do :; done".to_string(); busy];
        scripts.push(io);
        let mut children = Vec::new();
        for s in scripts {
            let child = Command::new("sh")
                .args(["-c", &s])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
                .context("starting a neighbour")?;
            children.push(child);
        }
        Ok(Neighbours(children))
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SAFETY: signalling the process group of a child we started.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

pub fn stress(args: &[String]) -> Result<()> {
    let mut args = args.iter().peekable();
    let busy = match args
        .peek()
        .filter(|a| a.starts_with(|c: char| c.is_ascii_digit()))
    {
        Some(n) => {
            let n = n.parse::<usize>().with_context(|| {
                format!("stress: N must be a count of busy neighbours, not {n:?}")
            })?;
            args.next();
            n
        }
        None => 2,
    };
    let tests: Vec<&str> = match args.map(String::as_str).collect::<Vec<_>>() {
        named if named.is_empty() => TESTS.to_vec(),
        named => {
            if let Some(t) = named.iter().find(|t| !TESTS.contains(t)) {
                bail!(
                    "stress: no test binary {t:?}; these run: {}",
                    TESTS.join(" ")
                );
            }
            named
        }
    };
    setup(true)?;
    // Built before the neighbours start: the tests are what is measured.
    run(cargo().args(["build", "--workspace"]))?;
    let mut build = cargo();
    build.args(["test", "-p", "gapscope-tests", "--no-run"]);
    for t in &tests {
        build.args(["--test", t]);
    }
    run(&mut build)?;
    let neighbours = Neighbours::start(busy)?;
    eprintln!("xtask: stress: {busy} busy neighbour(s) and one I/O-heavy one");
    let mut failed = Vec::new();
    let mut table = Vec::new();
    for t in &tests {
        let out = cargo()
            .args(["test", "-p", "gapscope-tests", "--test", t, "--"])
            .args(["--nocapture", "--test-threads", "1"])
            // Nothing may skip: a test that skips under load proves nothing.
            .envs(
                [
                    "GAPSCOPE_REQUIRE_BPF",
                    "GAPSCOPE_REQUIRE_TORCH",
                    "GAPSCOPE_REQUIRE_PROMETHEUS",
                    "GAPSCOPE_REQUIRE_PYTHON",
                ]
                .map(|v| (v, "1")),
            )
            .output()
            .with_context(|| format!("running the {t} tests"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let ok = out.status.success();
        eprintln!(
            "xtask: stress: {t}: {}",
            if ok { "passed" } else { "FAILED" }
        );
        let start = table.len();
        table.push(format!("{t}: {}", if ok { "passed" } else { "FAILED" }));
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let verdict =
                line.starts_with("test ") && (line.ends_with(" ok") || line.ends_with("FAILED"));
            if verdict {
                table.push(format!("  {line}"));
            } else if line.contains("panicked at") {
                // With the assertion's own first line: what it was about.
                table.push(format!("  {line}"));
                if let Some(why) = lines.next() {
                    table.push(format!("    {why}"));
                }
            } else if NUMBERS.iter().any(|w| line.contains(w)) && line.len() < 400 {
                table.push(format!("    {line}"));
            }
        }
        // As it goes: the whole run takes tens of minutes.
        println!("{}", table[start..].join("\n"));
        if !ok {
            failed.push(*t);
        }
    }
    drop(neighbours);
    println!("\nstress: the whole table\n{}", table.join("\n"));
    if !failed.is_empty() {
        bail!(
            "stress: beside {busy} busy neighbour(s) and an I/O-heavy one, failed: {}",
            failed.join(", ")
        );
    }
    println!("stress: every test passed beside {busy} busy neighbour(s) and an I/O-heavy one");
    Ok(())
}
