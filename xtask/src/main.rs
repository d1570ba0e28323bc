//! `cargo xtask`: the project's own commands.
//!
//!   setup     install what building and testing need (clang, libbpf headers,
//!             chromium for the HTML report test) with apt
//!   build     build everything (release)
//!   wheel     the Python wheel (`pip install gapscope-*.whl`), in target/wheels/
//!   demo      record an example workload end to end and print its report,
//!             then the same job with its first fix applied, and the diff
//!   test      formatting, lints, then every test (BPF tests need root)
//!   vmlinux   regenerate ebpf/vmlinux.h from this kernel's BTF
//!   gpu-bundle  one folder to check the CUPTI path on a machine with a GPU
//!   bench     speed and memory, each against a baseline measured in the same run:
//!             `bench [overhead|bystander|throughput|offline|kineto|agent]…` runs only those cases
//!   fuzz      run the fuzz targets (cargo-fuzz): `fuzz [TARGET] [SECS]`

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod bench;
mod python;
mod stress;
mod wheel;

const USAGE: &str =
    "usage: cargo xtask <setup|build|wheel|demo|test|stress [N] [TEST]…|vmlinux|gpu-bundle|bench [CASE]…|fuzz [TARGET] [SECS]>";

/// The fuzz targets (fuzz/fuzz_targets/), and how many executions each gets
/// in the gate (about 10–15 s apiece here: the targets differ in speed by
/// more than 10×).
const FUZZ_TARGETS: [(&str, u64); 4] = [
    ("session_file", 400_000),
    ("session_records", 250_000),
    ("wire_protocol", 3_000_000),
    ("kineto_trace", 300_000),
];
/// How hard each target is fuzzed.
#[derive(Clone, Copy)]
enum Fuzz {
    /// The gate in `test`: a fixed number of runs from a fixed random seed
    /// and a fresh corpus, so that a clean checkout passes or fails the
    /// same way every time; finding new bugs is what `Explore` is for.
    Gate,
    /// `cargo xtask fuzz`: this many seconds per target, a random seed, and
    /// the corpus grown by earlier runs.
    Explore(u64),
}
/// The gate's time cap per target, for slow machines.
const FUZZ_GATE_MAX_SECS: u64 = 60;

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
    let mut v = if found {
        vec![]
    } else {
        // Fonts too: without any, pages render as boxes.
        vec!["chromium", "fonts-liberation"]
    };
    // The agent's metrics are scraped by a real Prometheus, and checked with
    // its promtool.
    let on_path = |b: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(b).is_file()))
    };
    if !on_path("prometheus") || !on_path("promtool") {
        v.push("prometheus");
    }
    // A network that loses segments: a namespace of the test's own (ip)
    // with an nftables rule dropping some.
    if !on_path("nft") {
        v.push("nftables");
    }
    if !on_path("ip") {
        v.push("iproute2");
    }
    v
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

/// The venv with torch (CPU use only) that the DataLoader tests run in.
pub const TORCH_VENV: &str = "target/torch-venv";
/// The torch those tests were written against.
const TORCH: &str = "torch==2.15.0";

/// Makes the torch venv when it cannot import torch: PyPI's torch is a few
/// GB, so it is made once and kept with the build outputs.
fn torch_venv() {
    let venv = root().join(TORCH_VENV);
    let python = venv.join("bin/python");
    let imports = || {
        Command::new(&python)
            .args(["-c", "import torch, PIL, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // auditwheel checks the wheel's platform tag in the tests.
    if imports() {
        auditwheel(&python);
        tb_profiler(&python);
        return;
    }
    eprintln!("xtask: setup: installing {TORCH} into {TORCH_VENV} (a few GB, once)");
    let made = python.exists()
        || Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
    let installed = made
        && Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args([TORCH, "pillow", "numpy"])
            .status()
            .is_ok_and(|s| s.success());
    if !installed || !imports() {
        eprintln!(
            "xtask: setup: could not install {TORCH}; the DataLoader tests will skip (fail under GAPSCOPE_REQUIRE_TORCH=1)"
        );
    }
    auditwheel(&python);
    tb_profiler(&python);
}

/// The TensorBoard profiler plugin this version's Kineto tests compare
/// with.
const TB_PROFILER: &str = "torch-tb-profiler==0.4.3";

/// The TensorBoard profiler plugin's trace parser (PyPI), into the test
/// venv: the Kineto tests compare gapscope's step breakdown with its
/// overview. Without TensorBoard itself (only the parser is used, and it
/// needs pandas alone).
fn tb_profiler(python: &Path) {
    let imports = || {
        Command::new(python)
            .args(["-c", "import torch_tb_profiler.profiler.data"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if imports() {
        return;
    }
    let pip = |args: &[&str]| {
        Command::new(python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !(pip(&["pandas"]) && pip(&["--no-deps", TB_PROFILER]) && imports()) {
        eprintln!(
            "xtask: setup: could not install {TB_PROFILER}; the comparisons with it will skip (fail under GAPSCOPE_REQUIRE_TORCH=1)"
        );
    }
}

/// auditwheel (from PyPI) into the test venv, for the wheel's tests.
fn auditwheel(python: &Path) {
    let bin = python.with_file_name("auditwheel");
    if bin.exists() {
        return;
    }
    let ok = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "auditwheel",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "xtask: setup: could not install auditwheel; the wheel's tag test will skip (fail under GAPSCOPE_REQUIRE_WHEEL=1)"
        );
    }
}

/// Installs, with apt, what building needs and, `for_tests`, what the
/// tests need too. Without root, says what to install instead.
fn setup(for_tests: bool) -> Result<()> {
    fetch_cupti_wheel();
    if for_tests {
        torch_venv();
        python::pythons();
    }
    let mut missing = missing();
    let building = missing.len();
    if for_tests {
        missing.extend(missing_for_tests());
    }
    if missing.is_empty() {
        eprintln!(
            "xtask: setup: clang, libbpf headers{} are present",
            if for_tests {
                ", chromium, prometheus and nftables"
            } else {
                ""
            }
        );
        return Ok(());
    }
    if !is_root() || !have("apt-get") {
        let hint = format!(
            "install them with: sudo apt-get update && sudo apt-get install -y {}",
            missing.join(" ")
        );
        if building == 0 {
            // Only test tools: their tests skip (or fail under
            // GAPSCOPE_REQUIRE_BROWSER=1); building goes on.
            eprintln!(
                "xtask: setup: missing {}; the tests that need them will skip; {hint}",
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
    build_release().map(|_| ())
}

/// Release build of everything, the cdylibs included (`--bins` alone
/// leaves out the CUPTI shim gapscope looks for beside itself, without
/// which a simulated or real GPU is not seen); returns target/release.
fn build_release() -> Result<PathBuf> {
    run(cargo().args(["build", "--release", "--workspace"]))?;
    Ok(root().join("target/release"))
}

fn demo() -> Result<()> {
    if !is_root() {
        bail!("the demo records with eBPF and needs root: sudo -E cargo xtask demo");
    }
    setup(false)?;
    let release = build_release()?;
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
    // Then the fix the report puts first, applied (`--fix input.io`: the
    // same job with its reads taken out), and the two runs compared: what
    // the fix bought, and what leads now.
    let fixed = root().join("target/demo-fixed");
    let _ = std::fs::remove_dir_all(&fixed);
    run(Command::new(release.join("gapscope"))
        .arg("run")
        .arg("-q")
        .arg("-o")
        .arg(&fixed)
        .arg("--")
        .arg(release.join("simtrain"))
        .args(["--bottleneck", "mixed", "--fix", "input.io", "--data"])
        .arg(&data)
        .arg("--ground-truth")
        .arg(fixed.join("ground-truth.json")))?;
    eprintln!("\nxtask: the same job with input.io fixed, against the first run:\n");
    run(Command::new(release.join("gapscope"))
        .arg("diff")
        .arg(&out)
        .arg(&fixed))?;
    eprintln!(
        "\nxtask: demo done; re-read it any time with: target/release/gapscope report {}\n\
         and compare the runs with: target/release/gapscope diff {} {}",
        out.display(),
        out.display(),
        fixed.display()
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
    // The wheel the pip tests install (a release build of the binary and
    // the shim).
    wheel::wheel()?;
    if !is_root() && std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref() != Ok("1") {
        eprintln!(
            "xtask: not root: recording tests will be skipped (sudo -E cargo xtask test runs them)"
        );
    }
    // A bounded run of every fuzz target under libFuzzer, from the seeds;
    // before the tests, so that their summary is what a run ends on.
    fuzz(None, Fuzz::Gate)?;
    // Every test binary runs even after one fails: a failure early in the
    // suite must not hide how the rest fared.
    run(cargo().args(["test", "--workspace", "--no-fail-fast"]))
}

/// Runs the fuzz targets with cargo-fuzz (installed from crates.io when
/// missing), from fuzz/seeds/ and fuzz/regressions/ (past findings).
/// Stable Rust: no sanitizer, coverage instrumentation only.
fn fuzz(only: Option<&str>, how: Fuzz) -> Result<()> {
    let have_fuzz = cargo()
        .args(["fuzz", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_fuzz {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let targets: Vec<(&str, u64)> = match only {
        Some(t) => match FUZZ_TARGETS.iter().find(|(name, _)| *name == t) {
            Some(&target) => vec![target],
            None => {
                let names: Vec<&str> = FUZZ_TARGETS.iter().map(|(name, _)| *name).collect();
                bail!("no fuzz target {t}; targets: {}", names.join(", "))
            }
        },
        None => FUZZ_TARGETS.to_vec(),
    };
    for (t, gate_runs) in targets {
        let (corpus, limits) = match how {
            Fuzz::Gate => {
                // From the seeds alone every time: what earlier runs found
                // would change what this one explores.
                let corpus = root().join("target/fuzz-gate").join(t);
                let _ = std::fs::remove_dir_all(&corpus);
                (
                    corpus,
                    vec![
                        "-seed=1".to_string(),
                        format!("-runs={gate_runs}"),
                        format!("-max_total_time={FUZZ_GATE_MAX_SECS}"),
                    ],
                )
            }
            Fuzz::Explore(secs) => (
                root().join("target/fuzz-corpus").join(t),
                vec![format!("-max_total_time={secs}")],
            ),
        };
        std::fs::create_dir_all(&corpus)?;
        let mut cmd = cargo();
        cmd.current_dir(root().join("fuzz"))
            .args(["fuzz", "run", "--sanitizer", "none", t])
            .arg(&corpus)
            .arg(root().join("fuzz/seeds").join(t));
        let regressions = root().join("fuzz/regressions").join(t);
        if regressions.is_dir() {
            cmd.arg(regressions);
        }
        cmd.args(["--", "-max_len=65536"]).args(limits);
        run(&mut cmd).with_context(|| {
            format!(
                "fuzz target {t} found an input that breaks it (fuzz/artifacts/{t}/); \
                 once fixed, keep it in fuzz/regressions/{t}/"
            )
        })?;
    }
    Ok(())
}

/// target/gpu-bundle/: release gapscope with its shim beside it,
/// gs-shim-listen (the shim's socket without eBPF), the GPU check script
/// and its PyTorch workloads. Copy it to a GPU machine and run `./run.sh`
/// there (as root for the eBPF half; see run.sh for --python).
fn gpu_bundle() -> Result<()> {
    setup(false)?;
    let release = build_release()?;
    let out = root().join("target/gpu-bundle");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("workloads"))?;
    let binaries = ["gapscope", "libgapscope_cupti.so", "gs-shim-listen"];
    for f in binaries {
        let dst = out.join(f);
        std::fs::copy(release.join(f), &dst).with_context(|| format!("copying {f}"))?;
        strip_debug(&dst)?;
    }
    let glibc = glibc_floor(&binaries.map(|f| out.join(f)))?;
    let src = root().join("xtask/gpu-bundle");
    for f in ["run.sh", "checks.py"] {
        std::fs::copy(src.join(f), out.join(f)).with_context(|| format!("copying {f}"))?;
    }
    for e in std::fs::read_dir(src.join("workloads"))? {
        let e = e?;
        if e.path().extension().is_some_and(|x| x == "py") {
            std::fs::copy(e.path(), out.join("workloads").join(e.file_name()))?;
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(root())
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    std::fs::write(
        out.join("bundle.json"),
        format!(
            "{{\"commit\": \"{commit}{}\", \"glibc_floor\": \"{glibc}\"}}\n",
            if dirty { "+uncommitted" } else { "" }
        ),
    )?;
    let size = dir_size(&out)?;
    const MAX: u64 = 48 << 20;
    if size > MAX {
        bail!(
            "the GPU bundle is {:.1} MiB, over the {} MiB that can be carried to a GPU machine",
            size as f64 / (1 << 20) as f64,
            MAX >> 20
        );
    }
    eprintln!(
        "xtask: GPU bundle in {}: {:.1} MiB, needs glibc >= {glibc}\n\
         xtask: on a machine with an NVIDIA GPU and PyTorch: ./run.sh as root \
         (sudo loses venvs: sudo ./run.sh --python \"$(command -v python)\")",
        out.display(),
        size as f64 / (1 << 20) as f64,
    );
    Ok(())
}

/// Strips debug information from a copied binary (the symbol table stays,
/// for backtraces): `strip`, or `objcopy` where only that is installed.
fn strip_debug(path: &Path) -> Result<()> {
    for tool in ["strip", "objcopy"] {
        match Command::new(tool).arg("--strip-debug").arg(path).status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => bail!("{tool} --strip-debug {} failed ({s})", path.display()),
            Err(_) => continue,
        }
    }
    bail!("neither strip nor objcopy found: apt-get install binutils")
}

/// The newest GLIBC_x.y symbol version the binaries need (`objdump -T`):
/// the oldest glibc they load on.
fn glibc_floor(binaries: &[PathBuf]) -> Result<String> {
    let mut newest: Vec<u32> = Vec::new();
    for b in binaries {
        let o = Command::new("objdump")
            .arg("-T")
            .arg(b)
            .output()
            .context("running objdump -T (apt-get install binutils)")?;
        if !o.status.success() {
            bail!("objdump -T {} failed", b.display());
        }
        for v in String::from_utf8_lossy(&o.stdout)
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .filter_map(|w| w.strip_prefix("GLIBC_"))
        {
            let parsed: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            if let Some(parsed) = parsed.filter(|p| !p.is_empty()) {
                newest = newest.max(parsed);
            }
        }
    }
    if newest.is_empty() {
        bail!("objdump -T found no GLIBC_ version in the bundle's binaries");
    }
    Ok(newest
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("."))
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() {
            dir_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(n)
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
        "wheel" => {
            // Building needs what `build` needs (clang, libbpf headers).
            setup(false).and_then(|()| wheel::wheel()).map(|_| ())
        }
        "demo" => demo(),
        "test" => test(),
        "stress" => stress::stress(&std::env::args().skip(2).collect::<Vec<_>>()),
        "vmlinux" => vmlinux(),
        "gpu-bundle" => gpu_bundle(),
        "bench" => bench::bench(&std::env::args().skip(2).collect::<Vec<_>>()),
        "fuzz" => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            let target = args.iter().find(|a| a.parse::<u64>().is_err());
            let secs = args.iter().find_map(|a| a.parse().ok()).unwrap_or(60);
            fuzz(target.map(String::as_str), Fuzz::Explore(secs))
        }
        "" | "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n{USAGE}"),
    }
}
