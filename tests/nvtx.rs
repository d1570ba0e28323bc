//! NVTX through NVTX's own injection: a C program built against the real
//! nvtx3 headers (vendored in tests/nvtx/include) loads the shim through
//! `NVTX_INJECTION64_PATH`, as PyTorch or any nvtx3 client would, and the
//! ranges it annotates must reach a listener written here, each with the
//! name, domain, thread and timing the program itself saw. No CUDA, no GPU,
//! no BPF needed.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gapscope_tests::*;
use gapscope_wire::protocol::Frame;
use gapscope_wire::GpuRecord;
use serde_json::Value;

/// Builds tests/nvtx/client.c into `dir`.
fn build_client(dir: &Path) -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvtx");
    let include = here.join("include");
    assert!(
        include.join("nvtx3/nvToolsExt.h").exists(),
        "the nvtx3 headers are missing from {} (they are vendored in the repository)",
        include.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = dir.join("nvtx-client");
    let out = Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-I"])
        .arg(&include)
        .arg(here.join("client.c"))
        .arg("-o")
        .arg(&exe)
        .args(["-pthread", "-ldl"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(
        out.status.success(),
        "compiling the NVTX client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The first connection to `listener`, or a failure that says why none came.
fn accept(listener: &UnixListener, child: &mut Child) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).unwrap();
                return conn;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the NVTX client exited ({status}) without the shim connecting: \
                 InitializeInjectionNvtx2 must start the shim, which connects to GAPSCOPE_SOCKET"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the shim did not connect within 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn nvtx_ranges_of_a_real_nvtx3_client_reach_the_profiler() {
    let dir = scratch("nvtx");
    let client = build_client(dir.path());

    let name = format!("gapscope-test-nvtx.{}", std::process::id());
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    let mut child = Command::new(&client)
        .env("NVTX_INJECTION64_PATH", shim())
        .env("GAPSCOPE_SOCKET", format!("@{name}"))
        // Only NVTX loads the shim here; and no CUPTI to find, so what is
        // checked is the NVTX path alone.
        .env_remove("CUDA_INJECTION64_PATH")
        .env("GAPSCOPE_CUPTI", "/nonexistent/libcupti.so")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut conn = accept(&listener, &mut child);
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client failed: {:?}\n{stderr}",
        out.status
    );
    let truth: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The levels NVTX's push/pop returned to the program are the shim's.
    assert_eq!(truth["failed"], 0, "{stderr}");

    let frames = frames_of(&bytes);
    let Some(Frame::Hello(hello)) = frames.first() else {
        panic!("first frame is not Hello: {frames:?}")
    };
    assert_eq!(hello.pid as u64, truth["pid"].as_u64().unwrap());
    let ranges: Vec<(u64, u64, u32, &str, &str)> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::Records(rs) => Some(rs),
            _ => None,
        })
        .flatten()
        .filter_map(|r| match r {
            GpuRecord::Range {
                start,
                end,
                tid,
                name,
                domain,
            } => Some((*start, *end, *tid, name.as_str(), domain.as_str())),
            _ => None,
        })
        .collect();

    let expected = truth["ranges"].as_array().unwrap();
    assert_eq!(
        ranges.len(),
        expected.len(),
        "ranges received: {ranges:?}\nexpected: {expected:?}"
    );
    // Each range the program made matches exactly one record: same name,
    // domain and thread, inside the program's own clock readings.
    let matched: Vec<(u64, u64, u32, &str, &str)> = expected
        .iter()
        .map(|t| {
            let (name, domain) = (t["name"].as_str().unwrap(), t["domain"].as_str().unwrap());
            let tid = t["tid"].as_u64().unwrap() as u32;
            let (before, after) = (t["before"].as_u64().unwrap(), t["after"].as_u64().unwrap());
            let found: Vec<_> = ranges
                .iter()
                .filter(|r| r.3 == name && r.4 == domain && r.2 == tid)
                .filter(|r| before <= r.0 && r.0 <= r.1 && r.1 <= after)
                .collect();
            assert_eq!(found.len(), 1, "{t} matches {found:?} among {ranges:?}");
            *found[0]
        })
        .collect();

    let by_name = |n: &str| -> Vec<(u64, u64, u32, &str, &str)> {
        matched.iter().filter(|r| r.3 == n).copied().collect()
    };
    let main_tid = truth["tid"].as_u64().unwrap() as u32;
    // Nesting: each step holds its forward and backward, in that order.
    for (i, step) in by_name("step 0")
        .into_iter()
        .chain(by_name("step 1"))
        .enumerate()
    {
        let fwd = by_name("forward")[i];
        let bwd = by_name("backward")[i];
        assert!(
            step.0 <= fwd.0 && fwd.1 <= bwd.0 && bwd.1 <= step.1,
            "{step:?} {fwd:?} {bwd:?}"
        );
    }
    let comm = by_name("comm")[0];
    let allreduce = by_name("allreduce")[0];
    assert_eq!(allreduce.4, "gapscope.client");
    assert!(comm.0 <= allreduce.0 && allreduce.1 <= comm.1);
    // Start/end ranges: one per loader thread, and the handed-off range on
    // the thread that started it.
    let (a, b) = (by_name("load A")[0], by_name("load B")[0]);
    assert!(a.2 != main_tid && b.2 != main_tid && a.2 != b.2);
    assert_eq!(by_name("handoff")[0].2, main_tid);
    let mark = by_name("checkpoint")[0];
    assert_eq!(mark.0, mark.1, "a mark is an instant");
    assert_eq!(by_name("décodage ✓").len(), 1);
}
