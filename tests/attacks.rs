//! The security review's attacks, run for real: root runs gapscope, an
//! unprivileged user (a bare uid, 61001 and up, one per test, with no
//! passwd entry) does what the review's attacker did, and each test checks
//! the outcome that mattered — root's canary files (harmless files of the
//! test's own) unchanged in bytes, mode and owner, the target alive and
//! making progress, the run over within a generous bound, gapscope's memory
//! bounded. `GAPSCOPE_UNDER_TEST=/path/to/gapscope` runs them against
//! another build (its shim beside it), e.g. one from before the fixes.
//!
//! The C programs the attacker runs are in tests/attacks/.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gapscope_tests::*;

/// The gapscope under test: `$GAPSCOPE_UNDER_TEST`, else this build's.
fn gs() -> PathBuf {
    std::env::var_os("GAPSCOPE_UNDER_TEST")
        .map(PathBuf::from)
        .unwrap_or_else(gapscope)
}

/// What bounds every gapscope run: the old builds blew through it (they
/// hung for good); a fixed one ends in seconds.
const BOUND: Duration = Duration::from_secs(60);

/// A SIGKILL for a process of the test's (a no-op when it is gone).
fn kill(pid: u32) {
    // SAFETY: a signal to a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// A process the test started: killed and reaped when dropped, with the
/// processes it started (`also`) killed first.
struct Proc {
    child: Child,
    also: Vec<u32>,
}

impl Proc {
    fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        for &p in &self.also {
            kill(p);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One test's ground: a scratch directory of root's (0711, so the attacker
/// can reach what is put there for it), the attacker's home in it, and
/// root's files and directories for it to aim at.
struct Lab {
    dir: Scratch,
    uid: u32,
    home: PathBuf,
}

impl Lab {
    fn new(name: &str, uid: u32) -> Lab {
        let dir = scratch(&format!("attack-{name}"));
        // The attacker must reach it: every directory above it searchable
        // by others.
        for d in dir.path().ancestors().skip(1) {
            let mode = fs::metadata(d).unwrap().mode();
            assert!(
                mode & 0o001 != 0,
                "{} is not searchable by other users ({:o}): the attacker could not reach \
                 the test's files; build into a target directory others can reach",
                d.display(),
                mode & 0o7777
            );
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let home = dir.path().join("home");
        fs::create_dir(&home).unwrap();
        fs::set_permissions(&home, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        Lab { dir, uid, home }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A command run as the attacker, in its home, with a bare environment
    /// (std drops root's supplementary groups when it sets the uid).
    fn attacker(&self, prog: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(prog);
        c.uid(self.uid)
            .gid(self.uid)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", &self.home)
            .current_dir(&self.home)
            .stdin(Stdio::null());
        c
    }

    /// `sh -c SCRIPT sh ARGS…` as the attacker, which must succeed.
    fn attacker_sh(&self, script: &str, args: &[&OsStr]) {
        let out = self
            .attacker("sh")
            .args(["-c", script, "sh"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "attacker's `{script}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A file of the attacker's in its home.
    fn attacker_file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.home.join(name);
        fs::write(&p, bytes).unwrap();
        std::os::unix::fs::chown(&p, Some(self.uid), Some(self.uid)).unwrap();
        p
    }

    /// tests/attacks/SRC compiled to NAME in the lab (root's, 0755).
    fn build(&self, src: &str, name: &str, flags: &[&str]) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("attacks")
            .join(src);
        let out = self.path(name);
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let r = Command::new(&cc)
            .args([
                "-std=gnu11",
                "-O1",
                "-g",
                "-fno-omit-frame-pointer",
                "-Wall",
            ])
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(["-ldl", "-lpthread"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
        assert!(
            r.status.success(),
            "compiling {}: {}",
            src.display(),
            String::from_utf8_lossy(&r.stderr)
        );
        fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
        out
    }

    /// tests/attacks/target.c, built once per lab.
    fn target(&self) -> PathBuf {
        let p = self.path("target");
        if p.exists() {
            return p;
        }
        self.build("target.c", "target", &[])
    }

    /// What makes a process a GPU process to gapscope: a copy of the
    /// stand-in libcupti in the attacker's home, for it to map.
    fn gpu_lib(&self) -> PathBuf {
        let p = self.home.join("libcupti_standin.so");
        fs::copy(bin("libcupti_standin.so"), &p).unwrap();
        std::os::unix::fs::chown(&p, Some(self.uid), Some(self.uid)).unwrap();
        p
    }

    /// A directory of root's, 0700, holding `files`.
    fn root_dir(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = self.path(name);
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        for (f, text) in files {
            fs::write(d.join(f), text).unwrap();
            fs::set_permissions(d.join(f), fs::Permissions::from_mode(0o600)).unwrap();
        }
        d
    }

    /// A shared directory like /tmp: root's, 1777.
    fn sticky_dir(&self, name: &str) -> PathBuf {
        let d = self.path(name);
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).unwrap();
        d
    }

    /// Starts the attacker's target.c (`args`), its stdin a pipe, and
    /// returns it once it said "ready".
    fn start_target(&self, args: &[&OsStr]) -> Target {
        self.start(&self.target(), args, &[])
    }

    /// Starts `exe ARGS` as the attacker (`env` added), its stdin a pipe,
    /// and returns it once it said "ready".
    fn start(&self, exe: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Target {
        let mut c = self.attacker(exe);
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        Target::started(c, self.path("target.stderr"))
    }

    /// `gapscope attach -q --duration SECS --pid PID -o OUT EXTRA…`, as
    /// root, to its end or the bound.
    fn attach(&self, pid: u32, secs: &str, out: &Path, extra: &[&str]) -> Ended {
        Running::start(
            gs_cmd(["attach", "-q", "--duration", secs, "--pid"])
                .arg(pid.to_string())
                .arg("-o")
                .arg(out)
                .args(extra),
            &self.path(&format!(
                "{}.log",
                out.file_name().unwrap().to_string_lossy()
            )),
        )
        .finish(BOUND)
    }
}

/// `gapscope ARGS…` of the build under test.
fn gs_cmd<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(gs());
    c.args(args);
    c
}

/// A process of the attacker's that said "ready PID".
struct Target {
    proc: Proc,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn started(mut c: Command, stderr: PathBuf) -> Target {
        c.stderr(File::create(&stderr).unwrap());
        let mut child = c.spawn().unwrap();
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let proc = Proc {
            child,
            also: Vec::new(),
        };
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("ready"),
            "the target did not start ({line:?}): {}",
            fs::read_to_string(&stderr).unwrap_or_default()
        );
        Target {
            proc,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Its exit status if it has ended (reaped), None while it runs.
    fn ended(&mut self) -> Option<ExitStatus> {
        self.proc.child.try_wait().unwrap()
    }
}

/// A gapscope started as root, its output to files; killed and reaped if
/// dropped before it was waited for.
struct Running {
    pid: u32,
    started: Instant,
    out: PathBuf,
    err: PathBuf,
    reaped: bool,
    _child: Child,
}

/// How a run ended: its status (None: killed at the bound), how long it
/// took, its peak memory, what it printed.
struct Ended {
    status: Option<ExitStatus>,
    took: Duration,
    max_rss_kib: u64,
    stdout: String,
    stderr: String,
}

impl Ended {
    /// It ended by itself, within the bound, with status 0.
    #[track_caller]
    fn assert_ok(&self, what: &str) {
        let status = self.status.unwrap_or_else(|| {
            panic!(
                "{what}: still running after {:?} (killed); it said: {}",
                BOUND, self.stderr
            )
        });
        assert_eq!(
            status.code(),
            Some(0),
            "{what}: {status:?} after {:?}: {}",
            self.took,
            self.stderr
        );
    }
}

impl Running {
    fn start(cmd: &mut Command, log: &Path) -> Running {
        let out = log.with_extension("stdout");
        let err = log.with_extension("stderr");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        Running {
            pid: child.id(),
            started: Instant::now(),
            out,
            err,
            reaped: false,
            _child: child,
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits for its end, SIGKILLing it at `bound`.
    fn finish(mut self, bound: Duration) -> Ended {
        let mut status = 0;
        // SAFETY: a zeroed rusage is valid; wait4 on our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut killed = false;
        loop {
            let r = unsafe { libc::wait4(self.pid as i32, &mut status, libc::WNOHANG, &mut ru) };
            if r == self.pid as i32 {
                break;
            }
            assert_eq!(r, 0, "wait4: {}", std::io::Error::last_os_error());
            if !killed && self.started.elapsed() > bound {
                kill(self.pid);
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.reaped = true;
        Ended {
            status: (!killed).then(|| ExitStatus::from_raw(status)),
            took: self.started.elapsed(),
            max_rss_kib: ru.ru_maxrss as u64,
            stdout: fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: fs::read_to_string(&self.err).unwrap_or_default(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            kill(self.pid);
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid as i32, std::ptr::null_mut(), 0) };
        }
    }
}

/// A file of root's (0600) that must come through untouched.
struct Canary {
    path: PathBuf,
    bytes: Vec<u8>,
    ino: u64,
}

impl Canary {
    fn new(path: PathBuf, text: &str) -> Canary {
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let ino = fs::metadata(&path).unwrap().ino();
        Canary {
            path,
            bytes: text.as_bytes().to_vec(),
            ino,
        }
    }

    #[track_caller]
    fn assert_intact(&self) {
        let m = fs::symlink_metadata(&self.path)
            .unwrap_or_else(|e| panic!("canary {}: {e}", self.path.display()));
        let now = fs::read(&self.path).unwrap();
        assert!(
            now == self.bytes,
            "canary {} overwritten: now {} bytes, starting {:?}",
            self.path.display(),
            now.len(),
            String::from_utf8_lossy(&now[..now.len().min(16)])
        );
        assert!(
            m.file_type().is_file(),
            "canary {} replaced",
            self.path.display()
        );
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid(), m.ino()),
            (0o600, 0, 0, self.ino),
            "canary {}: mode, owner or inode changed",
            self.path.display()
        );
    }
}

/// What a file holds, in brief: its length, a checksum and how it starts.
fn summary(bytes: &[u8]) -> String {
    let sum = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!(
        "{} bytes, fnv {sum:016x}, {:?}",
        bytes.len(),
        String::from_utf8_lossy(&bytes[..bytes.len().min(16)])
    )
}

/// The names in a directory, each with its file's summary ("/" for a
/// directory).
fn contents(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let what = if e.file_type().unwrap().is_dir() {
                "/".to_string()
            } else {
                summary(&fs::read(e.path()).unwrap_or_default())
            };
            (e.file_name().to_string_lossy().into_owned(), what)
        })
        .collect();
    v.sort();
    v
}

fn maps(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}

fn status_field(pid: u32, key: &str) -> String {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// The mapping line of a shim injected through a memfd.
fn memfd_shim() -> String {
    format!("/memfd:{} (deleted)", gapscope_wire::LIBRARY_NAME)
}

fn session(dir: &Path) -> gapscope::session::Session {
    gapscope::session::read_session(dir)
        .unwrap_or_else(|e| panic!("reading the session in {}: {e}", dir.display()))
}

/// The children of a process, by /proc.
fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A counter a target keeps in a shared file (target.c's -c).
fn counter(path: &Path) -> u64 {
    let b = fs::read(path).unwrap_or_default();
    b.get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(0)
}

/// Whether the target's counter moves within `limit`.
fn advances(path: &Path, limit: Duration) -> bool {
    let before = counter(path);
    let until = Instant::now() + limit;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        if counter(path) > before {
            return true;
        }
    }
    false
}

// ---------------------------------------------------------------------
// Review 1: the shim copied into a target's /tmp through its links and
// mounts.

/// The attacker, in a user and mount namespace of its own with a tmpfs on
/// /tmp, plants `/tmp/.gapscope-N` (MODE, see tests/attacks/plant.c) for
/// the next thousand pids and for gapscope's own as soon as it starts;
/// root attaches to the attacker's GPU process in that namespace. Nothing
/// outside is touched, the attacker's /tmp is as it was, and the shim came
/// in through a memfd.
fn planted_shim_directory(test: &str, uid: u32, mode: &str) {
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new(test, uid);
    let plant = lab.build("plant.c", "plant", &[]);
    let gpu_lib = lab.gpu_lib();
    let canary = Canary::new(lab.path("canary"), "ORIGINAL root-only content\n");
    let root_dir = lab.root_dir("rootdir", &[("keep", "root's file\n")]);
    let del_dir = lab.root_dir("deldir", &[("important.conf", "keep me\n")]);
    let (root_before, del_before) = (contents(&root_dir), contents(&del_dir));
    let sink = lab.attacker_file("sink", b"the attacker's own file\n");
    let aim = match mode {
        "file" => &canary.path,
        "dir" => &root_dir,
        "bind" => &del_dir,
        _ => unreachable!(),
    };
    let mut c = lab.attacker("unshare");
    c.arg("-Urm")
        .arg(&plant)
        .args([
            mode.as_ref(),
            aim.as_os_str(),
            sink.as_os_str(),
            gpu_lib.as_os_str(),
        ])
        .arg("1000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(File::create(lab.path("plant.stderr")).unwrap());
    let mut child = c.spawn().unwrap();
    let mut to_planter = child.stdin.take().unwrap();
    let mut from_planter = BufReader::new(child.stdout.take().unwrap());
    let mut planter = Proc {
        child,
        also: Vec::new(),
    };
    let mut line = || {
        let mut l = String::new();
        from_planter.read_line(&mut l).unwrap();
        assert!(
            !l.is_empty(),
            "the planter stopped: {}",
            fs::read_to_string(lab.path("plant.stderr")).unwrap_or_default()
        );
        l
    };
    let range: Vec<u64> = line()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let pid: u32 = line()
        .trim()
        .strip_prefix("target ")
        .expect("target PID")
        .parse()
        .unwrap();
    planter.also.push(pid);
    assert_ne!(
        fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        fs::read_link("/proc/self/ns/mnt").unwrap(),
        "the target is in a mount namespace of its own"
    );
    let out = lab.path("out");
    let running = Running::start(
        gs_cmd(["attach", "-q", "--duration", "1", "--pid"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out),
        &lab.path("attach.log"),
    );
    writeln!(to_planter, "{}", running.pid).unwrap();
    assert_eq!(line().trim(), format!("planted {}", running.pid));
    let pre_planted = (range[0]..=range[1]).contains(&(running.pid as u64))
        || (range[1] < range[0]
            && (running.pid as u64 >= range[0] || running.pid as u64 <= range[1]));
    eprintln!(
        "gapscope is pid {}; planted in advance for {range:?}: {pre_planted}",
        running.pid
    );
    let tmp = |pid: u32| {
        let mut v: Vec<String> = fs::read_dir(format!("/proc/{pid}/root/tmp"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let tmp_before = tmp(pid);
    let ended = running.finish(BOUND);

    canary.assert_intact();
    assert_eq!(contents(&root_dir), root_before, "root's directory changed");
    assert_eq!(contents(&del_dir), del_before, "root's directory changed");
    assert_eq!(fs::read(&sink).unwrap(), b"the attacker's own file\n");
    ended.assert_ok("attach");
    assert_eq!(tmp(pid), tmp_before, "the attacker's /tmp changed");
    let m = maps(pid);
    assert!(
        m.lines().any(|l| l.ends_with(&memfd_shim())),
        "the shim was not loaded from a memfd: {}\n{m}",
        session(&out).notes.join("\n")
    );
    drop(to_planter);
}

#[test]
fn a_shim_path_planted_as_a_link_to_a_root_file_is_never_written() {
    planted_shim_directory(
        "a_shim_path_planted_as_a_link_to_a_root_file_is_never_written",
        61001,
        "file",
    );
}

#[test]
fn a_shim_directory_planted_as_a_link_to_a_root_directory_gets_nothing() {
    planted_shim_directory(
        "a_shim_directory_planted_as_a_link_to_a_root_directory_gets_nothing",
        61002,
        "dir",
    );
}

#[test]
fn a_root_directory_bind_mounted_in_a_shim_directory_is_not_emptied() {
    planted_shim_directory(
        "a_root_directory_bind_mounted_in_a_shim_directory_is_not_emptied",
        61003,
        "bind",
    );
}

// ---------------------------------------------------------------------
// Review 3: a run's default output directory planted in advance.

/// A run's directory name for the second `unix_secs` (as
/// `collect::default_out_name` makes it).
fn out_name(pid: u32, unix_secs: u64) -> String {
    let stamp = gapscope::clock::utc(unix_secs * 1_000_000_000)
        .trim_end_matches(" UTC")
        .replace(['-', ':'], "")
        .replace(' ', "-");
    format!("gapscope-{pid}-{stamp}")
}

/// The attacker makes `gapscope-<its pid>-<stamp>/` (0777, its own) in a
/// shared sticky directory for each of the next 90 seconds, each holding
/// `session.gsz` and `.report.txt.partial` as links to root's files; root
/// attaches from that directory without -o. Root's files are untouched,
/// the attacker's directories are as it left them, and the session is in a
/// directory made fresh, root's, private.
#[test]
fn a_planted_default_output_directory_is_never_used() {
    let test = "a_planted_default_output_directory_is_never_used";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("default-out", 61004);
    let shared = lab.sticky_dir("shared");
    let session_canary = Canary::new(lab.path("canary-session"), "ORIGINAL victim3\n");
    let report_canary = Canary::new(lab.path("canary-report"), "ORIGINAL cron.d\n");
    let target = lab.start_target(&["sleep".as_ref()]);
    let pid = target.pid();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let names: Vec<String> = (0..90).map(|i| out_name(pid, now + i)).collect();
    let mut args: Vec<&OsStr> = vec![
        shared.as_os_str(),
        session_canary.path.as_os_str(),
        report_canary.path.as_os_str(),
    ];
    args.extend(names.iter().map(OsStr::new));
    lab.attacker_sh(
        r#"cd "$1" && s=$2 && r=$3 && shift 3 && for d in "$@"; do
             mkdir -m 777 "$d" && ln -s "$s" "$d/session.gsz" && ln -s "$r" "$d/.report.txt.partial" || exit 1
           done"#,
        &args,
    );
    let ended = Running::start(
        gs_cmd(["attach", "-q", "--no-gpu", "--duration", "1", "--pid"])
            .arg(pid.to_string())
            .current_dir(&shared),
        &lab.path("attach.log"),
    )
    .finish(BOUND);

    session_canary.assert_intact();
    report_canary.assert_intact();
    ended.assert_ok("attach");
    for n in &names {
        let d = shared.join(n);
        assert_eq!(fs::symlink_metadata(&d).unwrap().uid(), lab.uid, "{n}");
        assert_eq!(
            fs::read_link(d.join("session.gsz")).unwrap(),
            session_canary.path,
            "{n}"
        );
        assert_eq!(
            fs::read_link(d.join(".report.txt.partial")).unwrap(),
            report_canary.path,
            "{n}"
        );
    }
    let fresh: Vec<PathBuf> = fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("gapscope-{pid}-")) && !names.contains(n))
        .map(|n| shared.join(n))
        .collect();
    assert_eq!(fresh.len(), 1, "the run's directory: {fresh:?}");
    let m = fs::symlink_metadata(&fresh[0]).unwrap();
    assert!(m.is_dir());
    assert_eq!(
        (m.uid(), m.mode() & 0o7777),
        (0, 0o700),
        "{}",
        fresh[0].display()
    );
    assert!(fresh[0].join("session.gsz").is_file());
    for f in fs::read_dir(&fresh[0]).unwrap() {
        let f = f.unwrap();
        let m = fs::symlink_metadata(f.path()).unwrap();
        assert!(m.is_file() && m.uid() == 0, "{}", f.path().display());
    }
    drop(target);
}

// ---------------------------------------------------------------------
// Review 4: a setuid process, its user's environment, and the sudo rule.

/// A setuid-root copy of target.c, the attacker's payload library (its
/// constructor writes a marker) and a file named libcuda.so.1 for the
/// setuid program to map (a GPU process, with no libcupti of its own
/// mapped, so that the library GAPSCOPE_CUPTI names comes first).
struct Setuid {
    exe: PathBuf,
    payload: PathBuf,
    marker: PathBuf,
    cuda: PathBuf,
}

impl Setuid {
    fn new(lab: &Lab) -> Setuid {
        let exe = lab.build("target.c", "suid-target", &[]);
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o4755)).unwrap();
        let marker = lab.home.join("PWNED");
        let built = lab.build(
            "payload.c",
            "payload.so",
            &[
                "-shared",
                "-fPIC",
                &format!("-DMARKER=\"{}\"", marker.display()),
            ],
        );
        let payload = lab.home.join("payload.so");
        fs::rename(built, &payload).unwrap();
        std::os::unix::fs::chown(&payload, Some(lab.uid), Some(lab.uid)).unwrap();
        let cuda = lab.attacker_file("libcuda.so.1", &[0u8; 4096]);
        Setuid {
            exe,
            payload,
            marker,
            cuda,
        }
    }

    /// The setuid program, started by the attacker with GAPSCOPE_CUPTI
    /// naming its payload.
    fn start(&self, lab: &Lab) -> Target {
        let t = lab.start(
            &self.exe,
            &["-m".as_ref(), self.cuda.as_os_str(), "sleep".as_ref()],
            &[("GAPSCOPE_CUPTI", self.payload.as_os_str())],
        );
        assert_setuid(t.pid(), lab.uid);
        t
    }

    #[track_caller]
    fn assert_payload_never_ran(&self, pid: u32) {
        assert!(
            !self.marker.exists(),
            "the attacker's library ran: {}",
            fs::read_to_string(&self.marker).unwrap_or_default()
        );
        assert!(!maps(pid).contains("payload.so"), "{}", maps(pid));
    }
}

#[track_caller]
fn assert_setuid(pid: u32, uid: u32) {
    let uids = status_field(pid, "Uid");
    let ids: Vec<u32> = uids
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(ids, [uid, 0, 0, 0], "not a setuid-root process: {uids}");
}

/// Root attaches to a setuid-root process the attacker started: without
/// --any-user it is not injected, the notes say it is setuid, and the
/// library its user named never runs.
#[test]
fn a_setuid_process_is_not_injected_unless_asked() {
    let test = "a_setuid_process_is_not_injected_unless_asked";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("setuid-a", 61005);
    let s = Setuid::new(&lab);
    let target = s.start(&lab);
    let out = lab.path("out");
    let ended = lab.attach(target.pid(), "1", &out, &["--no-exports"]);
    s.assert_payload_never_ran(target.pid());
    ended.assert_ok("attach");
    assert!(!maps(target.pid()).contains(gapscope_wire::LIBRARY_NAME));
    let notes = session(&out).notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("not injected") && n.contains("setuid")),
        "{notes:#?}"
    );
}

/// With --any-user the setuid process is injected, but the shim reads no
/// setting from its environment: the user's library never runs.
#[test]
fn an_injected_setuid_process_loads_nothing_its_user_named() {
    let test = "an_injected_setuid_process_loads_nothing_its_user_named";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("setuid-b", 61006);
    let s = Setuid::new(&lab);
    let target = s.start(&lab);
    let out = lab.path("out");
    let ended = lab.attach(target.pid(), "1", &out, &["--no-exports", "--any-user"]);
    // Time for a shim that would load its libcupti late.
    std::thread::sleep(Duration::from_millis(500));
    s.assert_payload_never_ran(target.pid());
    ended.assert_ok("attach");
    let m = maps(target.pid());
    assert!(
        m.lines().any(|l| l.ends_with(&memfd_shim())),
        "not injected: {:#?}",
        session(&out).notes
    );
}

/// Under sudo (SUDO_UID = the attacker), root attaches to the attacker's
/// own shell, whose child is the setuid program: the child is neither
/// injected nor has its address space in the session the user gets.
#[test]
fn under_sudo_a_setuid_child_is_neither_injected_nor_mapped() {
    let test = "under_sudo_a_setuid_child_is_neither_injected_nor_mapped";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("setuid-c", 61007);
    let s = Setuid::new(&lab);
    let mut sh = lab.attacker("sh");
    sh.args(["-c", r#""$0" -m "$1" sleep >/dev/null & wait"#])
        .arg(&s.exe)
        .arg(&s.cuda)
        .env("GAPSCOPE_CUPTI", &s.payload);
    let mut sh = Proc {
        child: sh.spawn().unwrap(),
        also: Vec::new(),
    };
    let shell = sh.id();
    let child = wait_for("the setuid child", Duration::from_secs(10), || {
        let c = *children(shell).first()?;
        (status_field(c, "Uid").split_whitespace().nth(1) == Some("0")).then_some(c)
    });
    sh.also.push(child);
    assert_setuid(child, lab.uid);
    std::thread::sleep(Duration::from_millis(200));
    let out = lab.home.join("rec");
    let uid = lab.uid.to_string();
    let ended = Running::start(
        gs_cmd(["attach", "-q", "--no-exports", "--duration", "1", "--pid"])
            .arg(shell.to_string())
            .arg("-o")
            .arg(&out)
            .env("SUDO_UID", &uid)
            .env("SUDO_GID", &uid)
            .env("SUDO_USER", "attacker"),
        &lab.path("attach.log"),
    )
    .finish(BOUND);
    std::thread::sleep(Duration::from_millis(500));
    s.assert_payload_never_ran(child);
    ended.assert_ok("attach");
    assert!(!maps(child).contains(gapscope_wire::LIBRARY_NAME));
    let rec = session(&out);
    assert!(
        rec.processes.iter().any(|p| p.pid == child),
        "the child is part of the recording"
    );
    assert!(
        !rec.maps.iter().any(|m| m.pid == child),
        "the user's session holds the setuid child's memory map"
    );
    assert!(!rec.injected.iter().any(|i| i.pid == child));
}

// ---------------------------------------------------------------------
// Review 6: the symbolizer and paths the target chose.

/// The attacker's process spins in an anonymous executable page (as JIT
/// code does) with its perf map, in its own /tmp, a FIFO nobody writes:
/// the recording ends and writes its report.
#[test]
fn a_fifo_as_a_perf_map_does_not_hang_the_recording() {
    let test = "a_fifo_as_a_perf_map_does_not_hang_the_recording";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("perfmap-fifo", 61008);
    let mut c = lab.attacker("unshare");
    c.args([
        "-Urm",
        "sh",
        "-c",
        r#"mount -t tmpfs -o mode=755 none /tmp && mkfifo /tmp/perf-$$.map && exec "$0" spin-anon"#,
    ])
    .arg(lab.target())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    let target = Target::started(c, lab.path("target.stderr"));
    let pid = target.pid();
    let perf_map = format!("/proc/{pid}/root/tmp/perf-{pid}.map");
    assert!(fs::symlink_metadata(&perf_map)
        .unwrap()
        .file_type()
        .is_fifo());
    let out = lab.path("out");
    let ended = lab.attach(pid, "2", &out, &["--no-gpu"]);
    ended.assert_ok("attach");
    assert!(out.join("report.txt").is_file(), "no report");
    eprintln!("attach took {:?}", ended.took);
}

/// The library the attacker's process spins in is unlinked and a FIFO
/// made in its place: the recording ends, and its stacks still name the
/// library's function (read from the file the process mapped).
#[test]
fn a_mapped_library_replaced_by_a_fifo_is_still_symbolized() {
    let test = "a_mapped_library_replaced_by_a_fifo_is_still_symbolized";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("lib-fifo", 61009);
    let built = lab.build("libspin.c", "libspin.so", &["-shared", "-fPIC"]);
    let lib = lab.home.join("libspin.so");
    fs::rename(built, &lib).unwrap();
    std::os::unix::fs::chown(&lib, Some(lab.uid), Some(lab.uid)).unwrap();
    let target = lab.start_target(&["spin-lib".as_ref(), lib.as_os_str()]);
    lab.attacker_sh(r#"rm -f "$1" && mkfifo "$1""#, &[lib.as_os_str()]);
    assert!(maps(target.pid()).contains("libspin.so (deleted)"));
    let out = lab.path("out");
    let ended = lab.attach(target.pid(), "2", &out, &["--no-gpu"]);
    ended.assert_ok("attach");
    assert!(out.join("report.txt").is_file(), "no report");
    let rec = session(&out);
    assert!(
        rec.symbols
            .values()
            .flatten()
            .any(|f| f.function == "gs_attack_spin"),
        "no stack names gs_attack_spin"
    );
    eprintln!("attach took {:?}", ended.took);
}

// ---------------------------------------------------------------------
// Review 7: a thread whose syscalls are all made from a signal handler.

/// The target's main thread only mallocs and frees; its only syscalls are
/// a SIGALRM handler's, every 100 µs. Five targets, an attach each (a
/// fresh one each time: a process injected once is not injected again):
/// after each attach the target still makes progress — gapscope injected
/// at a safe moment or said it found none (a signal handler's).
#[test]
fn a_target_whose_syscalls_come_from_a_signal_handler_is_never_deadlocked() {
    let test = "a_target_whose_syscalls_come_from_a_signal_handler_is_never_deadlocked";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("sighandler", 61010);
    let gpu = lab.gpu_lib();
    let mut outcomes = Vec::new();
    for k in 0..5 {
        let progress = lab.home.join(format!("progress-{k}"));
        let mut target = lab.start_target(&[
            "-m".as_ref(),
            gpu.as_os_str(),
            "-c".as_ref(),
            progress.as_os_str(),
            "sigalrm".as_ref(),
        ]);
        let pid = target.pid();
        assert!(advances(&progress, Duration::from_secs(5)));
        let out = lab.path(&format!("rec-{k}"));
        let ended = lab.attach(pid, "1", &out, &["--no-exports"]);
        assert!(target.ended().is_none(), "attach {k}: the target died");
        assert!(
            advances(&progress, Duration::from_secs(5)),
            "attach {k}: the target is stuck at {} (wchan {}): {:#?}",
            counter(&progress),
            fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default(),
            gapscope::session::read_session(&out).map(|s| s.notes).ok()
        );
        ended.assert_ok("attach");
        let notes = session(&out).notes;
        let outcome = notes
            .iter()
            .find(|n| n.contains("CUPTI shim was"))
            .cloned()
            .unwrap_or_default();
        assert!(
            outcome.contains("injected with ptrace")
                || (outcome.contains("not injected") && outcome.contains("signal handler")),
            "attach {k}: {notes:#?}"
        );
        outcomes.push(outcome);
    }
    eprintln!("{outcomes:#?}");
}

// ---------------------------------------------------------------------
// Review 8: strict seccomp.

/// A GPU process in strict seccomp mode (where the injected mmap would
/// kill it) is refused, and lives on, reading and answering.
#[test]
fn a_strict_seccomp_target_is_refused_and_lives_on() {
    let test = "a_strict_seccomp_target_is_refused_and_lives_on";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("strict", 61011);
    let gpu = lab.gpu_lib();
    let mut target = lab.start_target(&["-m".as_ref(), gpu.as_os_str(), "strict".as_ref()]);
    let pid = target.pid();
    wait_for("strict seccomp", Duration::from_secs(5), || {
        (status_field(pid, "Seccomp") == "1").then_some(())
    });
    let out = lab.path("out");
    let ended = lab.attach(pid, "1", &out, &["--no-exports"]);
    if let Some(status) = target.ended() {
        panic!("the target was killed: {status:?}");
    }
    ended.assert_ok("attach");
    let notes = session(&out).notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("not injected") && n.contains("strict seccomp")),
        "{notes:#?}"
    );
    target.stdin.as_mut().unwrap().write_all(b"x\n").unwrap();
    let mut line = String::new();
    target.stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "got\n");
    drop(target.stdin.take());
    let status = target.proc.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Root inside a rootless container (a user namespace of the attacker's)
/// holds every capability there and none out here: it is no process with
/// more rights than its user, and is injected as any of the user's.
#[test]
fn root_in_a_rootless_container_is_injected_as_its_user() {
    let test = "root_in_a_rootless_container_is_injected_as_its_user";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("rootless", 61019);
    let gpu = lab.gpu_lib();
    let target = lab.target();
    let t = lab.start(
        Path::new("unshare"),
        &[
            "-Ur".as_ref(),
            target.as_os_str(),
            "-m".as_ref(),
            gpu.as_os_str(),
            "read".as_ref(),
        ],
        &[],
    );
    let pid = t.pid();
    assert_ne!(status_field(pid, "CapEff").trim_start_matches('0'), "");
    let out = lab.path("out");
    let ended = lab.attach(pid, "1", &out, &["--no-exports"]);
    ended.assert_ok("attach");
    assert!(
        maps(pid).lines().any(|l| l.ends_with(&memfd_shim())),
        "not injected: {:#?}",
        session(&out).notes
    );
}

// ---------------------------------------------------------------------
// Review 9: a crafted or huge file named libc.so*.

/// A 4 KiB ELF header with one dynamic symbol table 2^63 bytes long, its
/// entries 0 bytes each.
fn zero_entsize_elf() -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    d[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    let put16 =
        |d: &mut Vec<u8>, at: usize, v: u16| d[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 =
        |d: &mut Vec<u8>, at: usize, v: u32| d[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |d: &mut Vec<u8>, at: usize, v: u64| d[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put16(&mut d, 16, 3); // ET_DYN
    put16(&mut d, 18, 62); // x86-64
    put32(&mut d, 20, 1);
    put64(&mut d, 40, 64); // e_shoff
    put16(&mut d, 52, 64);
    put16(&mut d, 58, 64); // e_shentsize
    put16(&mut d, 60, 2); // e_shnum
                          // Section 0: SHT_DYNSYM at offset 0, size 2^63, link 1, entsize 0.
    put32(&mut d, 64 + 4, 11);
    put64(&mut d, 64 + 32, 1 << 63);
    put32(&mut d, 64 + 40, 1);
    // Section 1: its string table.
    put32(&mut d, 128 + 4, 3);
    put64(&mut d, 128 + 32, 16);
    d
}

/// The attacker's GPU process maps `libc` (a file of its own named
/// libc.so.*) at 0x10000000, below its real libc: root's attach ends
/// within the bound with bounded memory, and the target lives on.
fn crafted_libc(test: &str, uid: u32, make: impl FnOnce(&Path)) {
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new(test, uid);
    let gpu = lab.gpu_lib();
    let libc = lab.home.join("libc.so.evil");
    make(&libc);
    std::os::unix::fs::chown(&libc, Some(lab.uid), Some(lab.uid)).unwrap();
    let progress = lab.home.join("progress");
    let fixed = format!("10000000:{}", libc.display());
    let mut target = lab.start_target(&[
        "-m".as_ref(),
        gpu.as_os_str(),
        "-M".as_ref(),
        fixed.as_ref(),
        "-c".as_ref(),
        progress.as_os_str(),
        "sleep".as_ref(),
    ]);
    let out = lab.path("out");
    let ended = lab.attach(target.pid(), "1", &out, &["--no-exports"]);
    eprintln!(
        "attach: {:?} in {:?}, peak RSS {} MiB",
        ended.status,
        ended.took,
        ended.max_rss_kib / 1024
    );
    ended.assert_ok("attach");
    assert!(
        ended.max_rss_kib < 300 * 1024,
        "gapscope's peak RSS: {} MiB",
        ended.max_rss_kib / 1024
    );
    assert!(target.ended().is_none(), "the target died");
    assert!(advances(&progress, Duration::from_secs(5)));
}

#[test]
fn a_libc_with_zero_sized_symbol_entries_does_not_hang_attach() {
    crafted_libc(
        "a_libc_with_zero_sized_symbol_entries_does_not_hang_attach",
        61014,
        |p| fs::write(p, zero_entsize_elf()).unwrap(),
    );
}

#[test]
fn a_huge_sparse_libc_is_not_read_whole() {
    crafted_libc("a_huge_sparse_libc_is_not_read_whole", 61015, |p| {
        File::create(p).unwrap().set_len(2 << 30).unwrap()
    });
}

// ---------------------------------------------------------------------
// Review 11: report -o, its temporary file, devices and links.

/// Skips (or fails under GAPSCOPE_REQUIRE_BPF=1) where the test is not
/// root: the attacks are on root.
fn root_ready(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert_ne!(
        std::env::var("GAPSCOPE_REQUIRE_BPF").as_deref(),
        Ok("1"),
        "{test}: needs root"
    );
    eprintln!("skipping {test}: not running as root");
    false
}

/// `gapscope report <golden session> -o OUT` as root.
fn report_to(lab: &Lab, out: &Path, log: &str) -> Ended {
    Running::start(
        gs_cmd(["report"]).arg(golden_session()).arg("-o").arg(out),
        &lab.path(log),
    )
    .finish(BOUND)
}

#[track_caller]
fn assert_roots_private_file(p: &Path) {
    let m = fs::symlink_metadata(p).unwrap();
    assert!(m.is_file() && m.len() > 0, "{}: {m:?}", p.display());
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (0, 0, 0o600),
        "{}",
        p.display()
    );
}

/// In a shared sticky directory the attacker plants the report's old
/// temporary name, as a link to root's file, then (elsewhere) as a file of
/// its own writable by all: root's report goes to neither, and is root's.
#[test]
fn report_output_never_goes_through_a_planted_temporary_file() {
    let test = "report_output_never_goes_through_a_planted_temporary_file";
    if !root_ready(test) {
        return;
    }
    let lab = Lab::new("report-partial", 61012);
    let canary = Canary::new(lab.path("canary"), "ORIGINAL victim4\n");
    let linked = lab.sticky_dir("linked");
    lab.attacker_sh(
        r#"ln -s "$1" "$2/.report.txt.partial""#,
        &[canary.path.as_os_str(), linked.as_os_str()],
    );
    let ended = report_to(&lab, &linked.join("report.txt"), "report-linked.log");
    canary.assert_intact();
    ended.assert_ok("report -o");
    assert_roots_private_file(&linked.join("report.txt"));

    let open = lab.sticky_dir("open");
    lab.attacker_sh(
        r#"umask 0 && : > "$1/.report.txt.partial" && chmod 666 "$1/.report.txt.partial""#,
        &[open.as_os_str()],
    );
    let ended = report_to(&lab, &open.join("report.txt"), "report-open.log");
    ended.assert_ok("report -o");
    assert_roots_private_file(&open.join("report.txt"));
}

/// `report -o` naming a character device (a null device of the test's, in
/// a private mount namespace on a tmpfs) or a link to /proc/self/fd/1
/// writes through them: the device stays a device, the link a link.
#[test]
fn report_output_to_a_device_or_a_link_writes_through_it() {
    let test = "report_output_to_a_device_or_a_link_writes_through_it";
    if !root_ready(test) {
        return;
    }
    let lab = Lab::new("report-device", 61016);
    let dev_dir = lab.path("dev");
    fs::create_dir(&dev_dir).unwrap();
    let ended = Running::start(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(
                r#"mount -t tmpfs none "$1" && mknod -m 666 "$1/null" c 1 3 &&
                   "$2" report "$3" -o "$1/null"; rc=$?; stat -c '%F %t:%T' "$1/null"; exit $rc"#,
            )
            .arg("sh")
            .arg(&dev_dir)
            .arg(gs())
            .arg(golden_session()),
        &lab.path("report-null.log"),
    )
    .finish(BOUND);
    ended.assert_ok("report -o <char device>");
    assert_eq!(ended.stdout.trim(), "character special file 1:3");

    let link = lab.path("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    let ended = report_to(&lab, &link, "report-link.log");
    ended.assert_ok("report -o <link to stdout>");
    assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(ended.stdout.len() > 100, "{:?}", ended.stdout);
}

// ---------------------------------------------------------------------
// Review 14: agent --dir.

/// Every path below `dir` with its file's summary ("/" for a directory).
fn tree(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.push((p.clone(), "/".to_string()));
            v.extend(tree(&p));
        } else {
            v.push((p.clone(), summary(&fs::read(&p).unwrap())));
        }
    }
    v.sort();
    v
}

/// `gapscope agent --pid PID --dir DIR --window 1 …` for two windows.
fn agent_two_windows(lab: &Lab, pid: u32, dir: &Path, log: &str) -> Ended {
    Running::start(
        gs_cmd(["agent", "--pid"])
            .arg(pid.to_string())
            .arg("--dir")
            .arg(dir)
            .args([
                "--keep",
                "1",
                "--listen",
                "127.0.0.1:0",
                "--window",
                "1",
                "--stop-after",
                "2",
            ]),
        &lab.path(log),
    )
    .finish(BOUND)
}

/// An existing directory with two-hour-old files in a subdirectory, given
/// as the agent's --dir with --keep 1: refused in one line, nothing
/// deleted. An empty directory is taken, made root's and private.
#[test]
fn agent_refuses_a_directory_it_did_not_make_and_deletes_nothing() {
    let test = "agent_refuses_a_directory_it_did_not_make_and_deletes_nothing";
    if !bpf_ready(test) {
        return;
    }
    let _lock = recording_lock();
    let lab = Lab::new("agent-dir", 61013);
    let data = lab.path("shared-data");
    let results = data.join("projectX/results-2025");
    fs::create_dir_all(&results).unwrap();
    fs::write(data.join("projectX/notes"), "notes\n").unwrap();
    fs::write(results.join("model.bin"), "weights\n").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    for p in [
        results.join("model.bin"),
        data.join("projectX/notes"),
        results.clone(),
        data.join("projectX"),
    ] {
        File::open(&p).unwrap().set_modified(old).unwrap();
    }
    let before = tree(&data);
    let sleep = Proc {
        child: Command::new("sleep").arg("60").spawn().unwrap(),
        also: Vec::new(),
    };
    let ended = agent_two_windows(&lab, sleep.id(), &data, "agent-existing.log");
    assert_eq!(tree(&data), before, "the agent deleted files");
    let status = ended.status.expect("the agent ended");
    assert!(!status.success(), "the agent took {}", data.display());
    assert_eq!(ended.stderr.trim().lines().count(), 1, "{}", ended.stderr);

    let empty = lab.path("empty");
    fs::create_dir(&empty).unwrap();
    let ended = agent_two_windows(&lab, sleep.id(), &empty, "agent-empty.log");
    ended.assert_ok("agent on an empty --dir");
    let m = fs::metadata(&empty).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700));
    assert!(empty.join(".gapscope-agent").exists());
}

// ---------------------------------------------------------------------
// Review 5: the agent's Kubernetes namespace label.

/// The cgroup v2 hierarchy's mount point, if there is one.
fn cgroup2() -> Option<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let at = pre.split_whitespace().nth(4)?;
            (post.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(at))
        })
}

/// `<cgroup2>/gapscope-attack-…/kubepods/besteffort/pod<uid>/ctr`, as the
/// kubelet would make it (removed when dropped, once empty).
struct PodCgroup {
    top: PathBuf,
    leaf: PathBuf,
}

impl PodCgroup {
    fn new(tag: &str, pod_uid: &str) -> Option<PodCgroup> {
        let top = cgroup2()?.join(format!("gapscope-attack-{}-{tag}", std::process::id()));
        let leaf = top.join(format!("kubepods/besteffort/pod{pod_uid}/ctr"));
        let cg = PodCgroup { top, leaf };
        match fs::create_dir_all(&cg.leaf) {
            Ok(()) => Some(cg),
            Err(e) => {
                eprintln!("cannot make {}: {e}", cg.leaf.display());
                None
            }
        }
    }

    fn add(&self, pid: u32) {
        fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let mut dirs: Vec<&Path> = self.leaf.ancestors().collect();
        dirs.truncate(dirs.iter().position(|d| *d == self.top).unwrap() + 1);
        for d in dirs {
            for _ in 0..100 {
                match fs::remove_dir(d) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// The recording windows /metrics counts for the pod.
fn pod_windows(body: &str, pod_uid: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with("gapscope_recording_windows_total{"))
        .filter(|l| l.contains(&format!("pod_uid=\"{pod_uid}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The attacker, in namespaces of its own with a tmpfs on /var, makes its
/// pod's service-account `namespace` a link to root's secret (`link`) or a
/// FIFO (`fifo`); root puts it in a pod's cgroup and runs the agent on it.
/// Returns /metrics once a window of the pod's was counted, then again
/// once the count rose, with the pod's uid.
fn agent_on_a_planted_pod(test: &str, uid: u32, how: &str, secret: &str) -> Option<[String; 2]> {
    if !bpf_ready(test) {
        return None;
    }
    let _lock = recording_lock();
    let lab = Lab::new(test, uid);
    let pod_uid = format!("0f1e2d3c-4b5a-4978-8796-a5b4c3{uid:06}");
    let Some(cgroup) = PodCgroup::new(how, &pod_uid) else {
        eprintln!("skipping {test}: no writable cgroup v2 hierarchy");
        return None;
    };
    let canary = Canary::new(lab.path("secret"), secret);
    let mut c = lab.attacker("unshare");
    c.args(["-Urm", "sh", "-c"])
        .arg(
            r#"mount -t tmpfs -o mode=755 none /var &&
               d=/var/run/secrets/kubernetes.io/serviceaccount && mkdir -p "$d" &&
               if [ "$1" = fifo ]; then mkfifo "$d/namespace"; else ln -s "$2" "$d/namespace"; fi &&
               echo ready && exec sleep 300"#,
        )
        .args(["sh", how])
        .arg(&canary.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let target = Target::started(c, lab.path("target.stderr"));
    cgroup.add(target.pid());
    let agent = Running::start(
        gs_cmd(["agent", "--window", "1", "--listen", "127.0.0.1:0", "--pid"])
            .arg(target.pid().to_string())
            .arg("--dir")
            .arg(lab.path("windows")),
        &lab.path("agent.log"),
    );
    let addr: std::net::SocketAddr =
        wait_for("the agent's address", Duration::from_secs(30), || {
            let e = agent.stderr();
            let rest = e.split("metrics on http://").nth(1)?;
            rest.split("/metrics").next()?.parse().ok()
        });
    let scrape = || {
        http_get(addr, "/metrics")
            .ok()
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let mut first = String::new();
    let n = wait_for("a window of the pod's", Duration::from_secs(30), || {
        first = scrape();
        pod_windows(&first, &pod_uid).filter(|&n| n >= 1.0)
    });
    let mut then = String::new();
    wait_for(
        "another window of the pod's",
        Duration::from_secs(20),
        || {
            then = scrape();
            pod_windows(&then, &pod_uid).filter(|&m| m > n)
        },
    );
    canary.assert_intact();
    drop(agent);
    drop(target);
    drop(cgroup);
    Some([first, then])
}

/// The namespace file a link to a root-only file: its text is never
/// published.
#[test]
fn a_pods_namespace_linked_to_a_root_secret_is_not_published() {
    let secret = "TOPSECRET-root-only-line";
    let Some(bodies) = agent_on_a_planted_pod(
        "a_pods_namespace_linked_to_a_root_secret_is_not_published",
        61017,
        "link",
        &format!("{secret}\n"),
    ) else {
        return;
    };
    for body in bodies {
        let published: Vec<&str> = body.lines().filter(|l| l.contains(secret)).collect();
        assert!(published.is_empty(), "published: {published:#?}");
    }
}

/// The namespace file a FIFO nobody writes: the agent goes on counting
/// the pod's windows.
#[test]
fn a_fifo_as_a_pods_namespace_does_not_freeze_the_agent() {
    agent_on_a_planted_pod(
        "a_fifo_as_a_pods_namespace_does_not_freeze_the_agent",
        61018,
        "fifo",
        "unused\n",
    );
}
