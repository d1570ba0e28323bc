//! `cargo xtask`: the project's own commands.
//!
//!   setup     install what building and testing need (clang, libbpf headers,
//!             chromium for the HTML report test) with apt
//!   build     build everything (release)
//!   demo      record an example workload end to end and print its report
//!   test      formatting, lints, then every test (BPF tests need root)
//!   vmlinux   regenerate ebpf/vmlinux.h from this kernel's BTF
//!   gpu-bundle  one folder to check the CUPTI path on a machine with a GPU
//!   bench     speed and memory, each against a baseline measured in the same run

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask <setup|build|demo|test|vmlinux|gpu-bundle|bench>";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("running {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Debian's headless-capable browser, for the HTML report test.
const BROWSERS: &[&str] = &["chromium", "chromium-browser", "google-chrome"];

/// What the tests need besides building: a browser.
fn missing_for_tests() -> Vec<&'static str> {
    let found = std::env::var_os("GAPSCOPE_CHROMIUM").is_some()
        || BROWSERS.iter().any(|b| {
            std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(b).is_file()))
        });
    if found {
        vec![]
    } else {
        // Fonts too: without any, pages render as boxes.
        vec!["chromium", "fonts-liberation"]
    }
}

/// What building the BPF programs needs and is not installed.
fn missing() -> Vec<&'static str> {
    let mut m = Vec::new();
    let clang = std::env::var("GAPSCOPE_CLANG").is_ok()
        || ["clang-19", "clang-20", "clang-18", "clang"]
            .iter()
            .any(|c| have(c));
    if !clang {
        m.extend(["clang-19", "llvm-19"]);
    }
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        m.push("libbpf-dev");
    }
    m
}

/// A real libcupti for the tests of the shim's no-GPU paths, from the
/// nvidia-cuda-cupti-cu12 wheel. Best effort: those tests skip without it.
pub const CUPTI_WHEEL_DIR: &str = "target/cupti-wheel";

fn fetch_cupti_wheel() {
    let dir = root().join(CUPTI_WHEEL_DIR);
    if dir.join("nvidia/cuda_cupti/lib/libcupti.so.12").exists() {
        return;
    }
    let _ = std::fs::create_dir_all(&dir);
    let ok = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .arg("nvidia-cuda-cupti-cu12==12.9.79")
        .arg("-d")
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let wheel = std::fs::read_dir(&dir).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
    });
    match (ok, wheel) {
        (true, Some(wheel)) => {
            let unzipped = Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !unzipped {
                eprintln!("xtask: setup: could not unpack {}", wheel.display());
            }
        }
        _ => eprintln!(
            "xtask: setup: could not fetch the nvidia-cuda-cupti-cu12 wheel; the tests that load a real libcupti will skip"
        ),
    }
}

/// Installs, with apt, what building needs and, `for_tests`, what the
/// tests need too. Without root, says what to install instead.
fn setup(for_tests: bool) -> Result<()> {
    fetch_cupti_wheel();
    let mut missing = missing();
    let building = missing.len();
    if for_tests {
        missing.extend(missing_for_tests());
    }
    if missing.is_empty() {
        eprintln!(
            "xtask: setup: clang, libbpf headers{} are present",
            if for_tests { " and chromium" } else { "" }
        );
        return Ok(());
    }
    if !is_root() || !have("apt-get") {
        let hint = format!(
            "install them with: sudo apt-get update && sudo apt-get install -y {}",
            missing.join(" ")
        );
        if building == 0 {
            // Only the browser: its test skips (or fails under
            // GAPSCOPE_REQUIRE_BROWSER=1); building goes on.
            eprintln!(
                "xtask: setup: missing {}; the HTML report test will skip; {hint}",
                missing.join(", ")
            );
            return Ok(());
        }
        bail!("missing: {}; {hint}", missing.join(", "));
    }
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    let mut still = self::missing();
    if for_tests {
        still.extend(missing_for_tests());
    }
    if !still.is_empty() {
        bail!("still missing after apt-get install: {}", still.join(", "));
    }
    Ok(())
}

fn build() -> Result<()> {
    setup(false)?;
    run(cargo().args(["build", "--release", "--workspace", "--bins"]))
}

fn demo() -> Result<()> {
    if !is_root() {
        bail!("the demo records with eBPF and needs root: sudo -E cargo xtask demo");
    }
    setup(false)?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "gapscope",
        "-p",
        "gapscope-examples",
    ]))?;
    let release = root().join("target/release");
    let out = root().join("target/demo");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // The dataset is made once, outside the recording.
    let data = root().join("target/simtrain-data");
    run(Command::new(release.join("simtrain"))
        .arg("--prepare")
        .arg("--data")
        .arg(&data))?;
    // A simulated GPU fed by a real data pipeline, slow storage and a
    // per-step synchronize: the diagnosis should name both.
    run(Command::new(release.join("gapscope"))
        .arg("run")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(release.join("simtrain"))
        .args(["--bottleneck", "mixed", "--data"])
        .arg(&data)
        .arg("--ground-truth")
        .arg(out.join("ground-truth.json")))?;
    eprintln!(
        "\nxtask: demo done; re-read it any time with: target/release/gapscope report {}",
        out.display()
    );
    Ok(())
}

fn test() -> Result<()> {
    setup(true)?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The end-to-end tests run the built binaries and load the built
    // cdylibs (the CUPTI shim beside gapscope, the stand-in libcuda).
    run(cargo().args(["build", "--workspace"]))?;
    if !is_root() && std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref() != Ok("1") {
        eprintln!(
            "xtask: not root: recording tests will be skipped (sudo -E cargo xtask test runs them)"
        );
    }
    run(cargo().args(["test", "--workspace"]))
}

/// target/gpu-bundle/: release gapscope with its shim beside it, the GPU
/// check script and its PyTorch workloads. Copy it to a GPU machine and run
/// `sudo ./run.sh` there.
fn gpu_bundle() -> Result<()> {
    setup(false)?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "gapscope",
        "-p",
        "gapscope-cupti",
    ]))?;
    let release = root().join("target/release");
    let out = root().join("target/gpu-bundle");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("workloads"))?;
    for f in ["gapscope", "libgapscope_cupti.so"] {
        std::fs::copy(release.join(f), out.join(f)).with_context(|| format!("copying {f}"))?;
    }
    let src = root().join("xtask/gpu-bundle");
    for f in ["run.sh", "checks.py"] {
        std::fs::copy(src.join(f), out.join(f))?;
    }
    for e in std::fs::read_dir(src.join("workloads"))? {
        let e = e?;
        std::fs::copy(e.path(), out.join("workloads").join(e.file_name()))?;
    }
    eprintln!(
        "xtask: GPU bundle in {}; on a machine with an NVIDIA GPU and PyTorch: sudo {}/run.sh",
        out.display(),
        out.display()
    );
    Ok(())
}

/// Runs a command to completion; returns (wall seconds, peak RSS bytes).
fn measure(cmd: &mut Command) -> Result<(f64, u64)> {
    let start = std::time::Instant::now();
    let child = cmd
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| describe(cmd))?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as i32;
    // SAFETY: waiting for our own child.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        bail!("wait4 failed for {}", describe(cmd));
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok((start.elapsed().as_secs_f64(), usage.ru_maxrss as u64 * 1024))
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

fn bench() -> Result<()> {
    setup(false)?;
    run(cargo().args(["build", "--release", "-p", "gapscope"]))?;
    let release = root().join("target/release");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut rows: Vec<(String, String)> = Vec::new();

    // Kineto import: a generated 200 MB trace, against reading the same
    // bytes (the floor any parser pays) measured in the same run.
    let trace = dir.join("synthetic-200MB.json");
    let size = generate_kineto(&trace, 200)?;
    let (read_s, _) = measure(Command::new("cat").arg(&trace))?;
    let (s, rss) = measure(
        Command::new(release.join("gapscope"))
            .args(["report", "--format", "json"])
            .arg(&trace),
    )?;
    rows.push((
        "kineto report, 200 MB trace".into(),
        format!(
            "{s:.2} s ({:.0} MB/s; reading the file alone {read_s:.2} s) · peak RSS {} MB = {:.2}× the file",
            size as f64 / s / 1e6,
            rss >> 20,
            rss as f64 / size as f64
        ),
    ));
    let _ = std::fs::remove_file(&trace);

    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("gapscope bench · {cpus} CPUs · {}", std::env::consts::ARCH);
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (k, v) in &rows {
        println!("  {k:<w$}  {v}");
    }
    Ok(())
}

fn vmlinux() -> Result<()> {
    let out = root().join("ebpf/vmlinux.h");
    let output = Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "c",
        ])
        .output()
        .context("running bpftool (apt-get install bpftool)")?;
    if !output.status.success() {
        bail!(
            "bpftool failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::write(&out, output.stdout)?;
    eprintln!("xtask: wrote {}", out.display());
    Ok(())
}

fn main() -> std::process::ExitCode {
    match dispatch() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch() -> Result<()> {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    match cmd.as_str() {
        "setup" => setup(true),
        "build" => build(),
        "demo" => demo(),
        "test" => test(),
        "vmlinux" => vmlinux(),
        "gpu-bundle" => gpu_bundle(),
        "bench" => bench(),
        "" | "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n{USAGE}"),
    }
}
