//! The shim's side of the socket: a bounded queue of encoded frames and one
//! writer thread. Application threads and CUPTI's callbacks only ever
//! `try_send`: when the profiler is slow or gone, frames are dropped and
//! counted, never waited for.

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Frames queued at most; beyond this the shim drops (and counts).
const QUEUE_FRAMES: usize = 64;

/// The abstract socket a shim listens on for `gapscope attach`.
pub fn control_socket_name(pid: u32) -> String {
    format!("gapscope-cupti.{pid}")
}

/// A socket name from the environment: "@name" is abstract, anything else
/// a filesystem path.
fn address(name: &str) -> std::io::Result<SocketAddr> {
    match name.strip_prefix('@') {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
        None => SocketAddr::from_pathname(name),
    }
}

pub fn connect(name: &str) -> std::io::Result<UnixStream> {
    let s = UnixStream::connect_addr(&address(name)?)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

pub fn listen(name: &str) -> std::io::Result<UnixListener> {
    UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)
}

/// uid of the process at the other end of a Unix socket.
pub fn peer_uid(s: &UnixStream) -> Option<u32> {
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
    (rc == 0).then_some(cred.uid)
}

pub struct Transport {
    tx: Option<SyncSender<(Vec<u8>, u64)>>,
    connected: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    done: Receiver<()>,
}

impl Transport {
    pub fn start(mut stream: UnixStream) -> Transport {
        // A profiler that stops reading must not hold the writer forever; a
        // timed-out write leaves a torn frame, so the link is dropped then.
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        let (tx, rx) = sync_channel::<(Vec<u8>, u64)>(QUEUE_FRAMES);
        let (done_tx, done) = sync_channel(1);
        let connected = Arc::new(AtomicBool::new(true));
        let dropped = Arc::new(AtomicU64::new(0));
        let (c, d) = (connected.clone(), dropped.clone());
        let spawned = std::thread::Builder::new()
            .name("gapscope-cupti".into())
            .spawn(move || {
                for (frame, records) in rx {
                    if !c.load(Ordering::Relaxed) {
                        d.fetch_add(records, Ordering::Relaxed);
                        continue;
                    }
                    if stream.write_all(&frame).is_err() {
                        c.store(false, Ordering::Relaxed);
                        d.fetch_add(records, Ordering::Relaxed);
                    }
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

    /// Queues a frame holding `records` records; never blocks.
    pub fn send(&self, frame: Vec<u8>, records: u64) -> bool {
        let Some(tx) = &self.tx else { return false };
        if !self.is_connected() {
            self.dropped.fetch_add(records, Ordering::Relaxed);
            return false;
        }
        match tx.try_send((frame, records)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(records, Ordering::Relaxed);
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
    fn frames_reach_the_peer_and_a_dead_peer_costs_nothing() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = Transport::start(a);
        assert!(t.send(b"hello".to_vec(), 1));
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        drop(b);
        // Writes now fail; sends return quickly and are counted as dropped.
        let start = Instant::now();
        for _ in 0..1000 {
            t.send(vec![0u8; 1024], 10);
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
            if !t.send(vec![0u8; 64 << 10], 1) {
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
}
