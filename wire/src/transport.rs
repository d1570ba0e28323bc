//! The shim's side of the socket: a bounded queue of encoded frames and one
//! writer thread. Application threads and CUPTI's callbacks only ever
//! `try_send`: when the profiler is slow or gone, frames are dropped and
//! counted, never waited for. What a dropped frame covered is remembered,
//! and the writer tells the profiler before the next frame it delivers, so
//! that the analysis knows which span of time its GPU view is missing.

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use crate::protocol::{encode, Frame};
use std::time::{Duration, Instant};

/// Frames queued at most; beyond this the shim drops (and counts).
const QUEUE_FRAMES: usize = 256;

/// The abstract socket a shim listens on for `gapscope attach`: the
/// process's pid as its own pid namespace numbers it, and that namespace's
/// inode. Both sides can compute it (the shim from `/proc/self`, attach from
/// `/proc/<pid>`), and it stays unique where several pid namespaces share a
/// network namespace (two containers' pid 1 in one pod).
pub fn control_socket_name(nspid: u32, pidns_inode: u64) -> String {
    format!("gapscope-cupti.{nspid}.{pidns_inode}")
}

/// The control socket name of process `pid` of the caller's own pid
/// namespace (the shim itself, or a child that shares it). Where that
/// namespace cannot be read (no /proc), inode 0, which attach never
/// computes: the shim is then not found rather than found under another
/// process's name.
pub fn local_control_socket_name(pid: u32) -> String {
    control_socket_name(
        pid,
        namespace_inode(std::path::Path::new("/proc/self/ns/pid")).unwrap_or(0),
    )
}

/// The inode of the namespace a `/proc/<pid>/ns/<kind>` link names: its
/// target reads `kind:[inode]`.
pub fn namespace_inode(link: &std::path::Path) -> Option<u64> {
    parse_namespace_link(std::fs::read_link(link).ok()?.to_str()?)
}

/// `pid:[4026531836]` -> 4026531836.
fn parse_namespace_link(target: &str) -> Option<u64> {
    let (_, rest) = target.split_once(":[")?;
    rest.strip_suffix(']')?.parse().ok()
}

/// A socket name from the environment: "@name" is abstract, anything else
/// a filesystem path.
fn address(name: &str) -> std::io::Result<SocketAddr> {
    match name.strip_prefix('@') {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
        None => SocketAddr::from_pathname(name),
    }
}

/// How long the shim waits to get into a busy profiler's backlog. It runs
/// inside `cuInit`: a stopped or swamped profiler must not hold the job's
/// first CUDA call for longer than this.
const CONNECT_PATIENCE: Duration = Duration::from_millis(100);

/// Connects without ever blocking longer than [`CONNECT_PATIENCE`]: a
/// non-blocking Unix connect fails at once (EAGAIN) while the listener's
/// backlog is full, so it is retried briefly rather than waited on.
pub fn connect(name: &str) -> std::io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    let addr = address(name)?;
    let path: Vec<u8> = match addr.as_abstract_name() {
        Some(n) => std::iter::once(0u8).chain(n.iter().copied()).collect(),
        None => addr
            .as_pathname()
            .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
            .unwrap_or_default(),
    };
    // SAFETY: a zeroed sockaddr_un is valid; the path fits or is refused.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= sa.sun_path.len() {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(&path) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + path.len()) as libc::socklen_t;
    // SAFETY: plain socket call; the fd is owned by the stream below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let s = unsafe { UnixStream::from_raw_fd(fd) };
    let deadline = Instant::now() + CONNECT_PATIENCE;
    loop {
        // SAFETY: connect with a sockaddr_un of the length computed above.
        let rc = unsafe { libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) };
        if rc == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        let again = e.raw_os_error() == Some(libc::EAGAIN);
        if !again || Instant::now() >= deadline {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

pub fn listen(name: &str) -> std::io::Result<UnixListener> {
    UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)
}

/// Who is at the other end of a Unix socket (pid as our pid namespace
/// numbers it, uid, gid).
pub fn peer_cred(s: &UnixStream) -> Option<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a properly sized ucred.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// uid of the process at the other end of a Unix socket.
pub fn peer_uid(s: &UnixStream) -> Option<u32> {
    peer_cred(s).map(|c| c.uid)
}

/// Runs of consecutive dropped frames since the profiler was last told:
/// each run's time span and record count. A frame that gets into the queue
/// ends a run, so no span claims the time of a frame that was delivered.
#[derive(Default)]
struct Loss {
    /// (start, end, records).
    runs: Vec<(u64, u64, u64)>,
}

/// Runs kept at most between two writes; beyond, the last one grows (wider
/// than the truth, never narrower).
const MAX_RUNS: usize = 64;

impl Loss {
    /// A frame of `records` records covering `span` was dropped; `run`
    /// says whether the previous frame was dropped too.
    fn add(&mut self, records: u64, span: Option<(u64, u64)>, run: bool) {
        // Records with no time (device descriptions) cannot mark a window.
        let Some((s, e)) = span else { return };
        let full = self.runs.len() >= MAX_RUNS;
        match self.runs.last_mut() {
            Some(last) if run || full => {
                *last = (last.0.min(s), last.1.max(e), last.2 + records);
            }
            _ => self.runs.push((s, e, records)),
        }
    }

    /// The Lost frames to send, encoded; empty when there is nothing to say.
    fn take_frames(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for (start, end, records) in self.runs.drain(..) {
            encode(
                &Frame::Lost {
                    start,
                    end,
                    records,
                },
                &mut out,
            );
        }
        out
    }
}

/// What is queued: an encoded frame, how many records it holds, and the
/// time they cover.
type Queued = (Vec<u8>, u64, Option<(u64, u64)>);

pub struct Transport {
    tx: Option<SyncSender<Queued>>,
    connected: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    loss: Arc<Mutex<Loss>>,
    /// The last frame offered was dropped: a drop now continues its run.
    dropping: AtomicBool,
    done: Receiver<()>,
}

impl Transport {
    pub fn start(mut stream: UnixStream) -> Transport {
        // A profiler that stops reading must not hold the writer forever; a
        // timed-out write leaves a torn frame, so the link is dropped then.
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        let (tx, rx) = sync_channel::<Queued>(QUEUE_FRAMES);
        let (done_tx, done) = sync_channel(1);
        let connected = Arc::new(AtomicBool::new(true));
        let dropped = Arc::new(AtomicU64::new(0));
        let loss = Arc::new(Mutex::new(Loss::default()));
        let (c, d, l) = (connected.clone(), dropped.clone(), loss.clone());
        let spawned = std::thread::Builder::new()
            .name("gapscope-cupti".into())
            .spawn(move || {
                let report_loss = |stream: &mut UnixStream| {
                    let pending = l.lock().map(|mut l| l.take_frames()).unwrap_or_default();
                    pending.is_empty() || stream.write_all(&pending).is_ok()
                };
                for (frame, records, _) in rx {
                    if !c.load(Ordering::Relaxed) {
                        d.fetch_add(records, Ordering::Relaxed);
                        continue;
                    }
                    if !report_loss(&mut stream) || stream.write_all(&frame).is_err() {
                        c.store(false, Ordering::Relaxed);
                        d.fetch_add(records, Ordering::Relaxed);
                    }
                }
                if c.load(Ordering::Relaxed) {
                    report_loss(&mut stream);
                }
                let _ = stream.flush();
                let _ = done_tx.send(());
            });
        if spawned.is_err() {
            connected.store(false, Ordering::Relaxed);
        }
        Transport {
            tx: Some(tx),
            connected,
            dropped,
            loss,
            dropping: AtomicBool::new(false),
            done,
        }
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Records lost in this connection (queue full, or the profiler gone).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queues a frame holding `records` records covering `span`; never
    /// blocks.
    pub fn send(&self, frame: Vec<u8>, records: u64, span: Option<(u64, u64)>) -> bool {
        let Some(tx) = &self.tx else { return false };
        if !self.is_connected() {
            self.dropped.fetch_add(records, Ordering::Relaxed);
            return false;
        }
        match tx.try_send((frame, records, span)) {
            Ok(()) => {
                if records > 0 {
                    self.dropping.store(false, Ordering::Relaxed);
                }
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(records, Ordering::Relaxed);
                if records > 0 {
                    let run = self.dropping.swap(true, Ordering::Relaxed);
                    if let Ok(mut l) = self.loss.lock() {
                        l.add(records, span, run);
                    }
                }
                false
            }
        }
    }

    /// Stops accepting frames and waits (at most `timeout`) for the queue
    /// to reach the socket.
    pub fn close(mut self, timeout: Duration) {
        self.tx.take();
        let deadline = Instant::now() + timeout;
        let _ = self
            .done
            .recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn namespace_links_give_their_inode() {
        assert_eq!(parse_namespace_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_namespace_link("net:[1]"), Some(1));
        assert_eq!(parse_namespace_link("pid:[]"), None);
        assert_eq!(parse_namespace_link("pid:[12"), None);
        assert_eq!(parse_namespace_link("/dev/null"), None);
        // The name holds both parts, so two namespaces' pid 1 differ.
        assert_ne!(control_socket_name(1, 10), control_socket_name(1, 11));
    }

    #[test]
    fn frames_reach_the_peer_and_a_dead_peer_costs_nothing() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = Transport::start(a);
        assert!(t.send(b"hello".to_vec(), 1, None));
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        drop(b);
        // Writes now fail; sends return quickly and are counted as dropped.
        let start = Instant::now();
        for _ in 0..1000 {
            t.send(vec![0u8; 1024], 10, None);
        }
        assert!(start.elapsed() < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_connected());
        assert!(t.dropped() > 0);
        t.close(Duration::from_secs(1));
    }

    #[test]
    fn a_slow_peer_fills_the_queue_and_sends_never_block() {
        let (a, _b) = UnixStream::pair().unwrap(); // never read
        let t = Transport::start(a);
        let start = Instant::now();
        let mut refused = 0;
        for _ in 0..10_000 {
            if !t.send(vec![0u8; 64 << 10], 1, None) {
                refused += 1;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(refused > 0);
        assert_eq!(t.dropped(), refused);
        t.close(Duration::from_millis(100));
    }

    fn lost_frames(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
        let mut d = crate::protocol::Decoder::new();
        d.push(bytes);
        let mut out = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            match f {
                Frame::Lost {
                    start,
                    end,
                    records,
                } => out.push((start, end, records)),
                other => panic!("unexpected {other:?}"),
            }
        }
        out
    }

    #[test]
    fn a_delivered_frame_splits_the_runs_of_dropped_ones() {
        let mut l = Loss::default();
        l.add(2, Some((0, 10)), false);
        l.add(3, Some((10, 20)), true);
        // Here a frame covering 30..40 got through: the next drop starts a
        // new run, so no span claims 30..40.
        l.add(1, Some((50, 60)), false);
        l.add(4, None, true); // no time to place
        assert_eq!(lost_frames(&l.take_frames()), vec![(0, 20, 5), (50, 60, 1)]);
        assert!(l.take_frames().is_empty(), "told once");
        // Bounded: past MAX_RUNS separate runs, the last one widens.
        for i in 0..100u64 {
            l.add(1, Some((i * 100, i * 100 + 10)), false);
        }
        let runs = lost_frames(&l.take_frames());
        assert_eq!(runs.len(), MAX_RUNS);
        assert_eq!(runs[MAX_RUNS - 1], (6300, 9910, 37));
        assert_eq!(runs.iter().map(|r| r.2).sum::<u64>(), 100);
    }

    #[test]
    fn the_profiler_learns_which_span_of_time_dropped_frames_covered() {
        // Frame i stands for 3 records covering [1000 i, 1000 i + 500]. The
        // peer reads nothing until the queue has overflowed, then all.
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = Transport::start(a);
        let n = 400u64;
        let mut refused = Vec::new();
        for i in 0..n {
            let mut frame = Vec::new();
            encode(
                &Frame::Info(format!("{i:06}{}", "x".repeat(60_000))),
                &mut frame,
            );
            if !t.send(frame, 3, Some((i * 1000, i * 1000 + 500))) {
                refused.push(i);
            }
        }
        assert!(!refused.is_empty(), "the queue never overflowed");
        let dropped = t.dropped();
        let reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            b.read_to_end(&mut bytes).unwrap();
            bytes
        });
        t.close(Duration::from_secs(10));
        let mut d = crate::protocol::Decoder::new();
        d.push(&reader.join().unwrap());
        let (mut delivered, mut lost) = (Vec::new(), Vec::new());
        while let Some(f) = d.next_frame().unwrap() {
            match f {
                Frame::Info(s) => delivered.push(s[..6].parse::<u64>().unwrap()),
                Frame::Lost {
                    start,
                    end,
                    records,
                } => lost.push((start, end, records)),
                other => panic!("unexpected {other:?}"),
            }
        }
        let missing: Vec<u64> = (0..n).filter(|i| !delivered.contains(i)).collect();
        assert_eq!(missing, refused);
        assert_eq!(lost.iter().map(|l| l.2).sum::<u64>(), dropped);
        assert_eq!(dropped, 3 * refused.len() as u64);
        for i in &missing {
            assert!(
                lost.iter()
                    .any(|&(s, e, _)| s <= i * 1000 && i * 1000 + 500 <= e),
                "frame {i} was dropped and no Lost frame covers it: {lost:?}"
            );
        }
        // Nothing delivered is claimed lost.
        for i in &delivered {
            assert!(
                !lost.iter().any(|&(s, e, _)| s <= i * 1000 && i * 1000 <= e),
                "frame {i} arrived but is inside {lost:?}"
            );
        }
    }
}
