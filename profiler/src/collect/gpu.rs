//! The profiler's end of the GPU streams: accepts (run) or opens (attach)
//! one Unix socket per CUDA process, decodes the shim's frames and hands
//! them to the event loop as session records.

use std::collections::HashSet;
use std::os::linux::net::SocketAddrExt;
use std::path::PathBuf;
use std::time::Duration;

use gapscope_wire::protocol::{Decoder, Frame};
use tokio::net::UnixStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

use super::{pidns, procfs};
use crate::session::{GpuBatch, GpuSource, Record, SourceKind};

/// Where `gapscope run` finds the shim: installed beside the binary.
pub fn shim_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join(gapscope_wire::LIBRARY_NAME);
    p.exists().then_some(p)
}

/// A listening socket for `run`, bound before the target starts so the
/// target's environment can name it.
pub struct GpuListener {
    listener: std::os::unix::net::UnixListener,
    /// The value of GAPSCOPE_SOCKET ("@" = abstract namespace).
    pub env_value: String,
}

impl GpuListener {
    pub fn bind() -> std::io::Result<GpuListener> {
        let mut nonce = [0u8; 8];
        // SAFETY: getrandom into a local buffer.
        unsafe { libc::getrandom(nonce.as_mut_ptr() as *mut _, nonce.len(), 0) };
        let name = format!(
            "gapscope.{}.{:016x}",
            std::process::id(),
            u64::from_le_bytes(nonce)
        );
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        Ok(GpuListener {
            listener,
            env_value: format!("@{name}"),
        })
    }
}

/// All GPU connections of one recording. What it keeps is bounded by the
/// processes alive: a finished stream's task and socket are let go as the
/// next connections are made, and a process is forgotten once it has left
/// the tree.
pub struct GpuStreams {
    tasks: JoinSet<()>,
    tx: UnboundedSender<Record>,
    /// Live processes connected to (attach), so each is connected once.
    connected: HashSet<u32>,
    /// Attach-mode streams still being read, to ask each shim to stop at the
    /// end; the serving task owns the stream and drops it when it ends.
    attached: Vec<std::sync::Weak<UnixStream>>,
    stop_accepting: Option<tokio::sync::oneshot::Sender<()>>,
    /// Attach: the start of the recording, from which the processes found
    /// at the first connect went unseen until their shims record.
    window_start: Option<u64>,
}

/// Pid of the process at the other end of a Unix socket.
fn peer_pid(s: &UnixStream) -> Option<u32> {
    s.peer_cred().ok()?.pid().map(|p| p as u32)
}

/// Whether `pid` is `root` or one of its descendants.
fn in_tree(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if p == root {
            return true;
        }
        match procfs::process_info(p) {
            Some(info) if info.ppid > 1 && info.ppid != p => p = info.ppid,
            _ => return false,
        }
    }
    false
}

/// Serves one shim's stream. `blind_since`: a dormant shim attached to —
/// what its process's GPU did from then until the shim says it records
/// (its `Sighted` frame) was not seen.
async fn serve(
    stream: std::sync::Arc<UnixStream>,
    pid: u32,
    tx: UnboundedSender<Record>,
    blind_since: Option<u64>,
) {
    let mut dec = Decoder::new();
    let mut host_ids = pidns::HostIds::new(pid);
    let mut buf = vec![0u8; 256 << 10];
    let mut end = StreamEnd {
        pid,
        tx: tx.clone(),
        opened: gapscope_wire::clock::monotonic_ns(),
        last_record_end: 0,
        goodbye: false,
        attached: blind_since.is_some(),
        sighted: None,
        blind: blind_since.map(|t| {
            (
                t,
                "before its shim began recording (it was dormant, or not yet loaded, when \
                 gapscope attached) and the work queued until then had run"
                    .to_string(),
            )
        }),
    };
    loop {
        let n = match stream.readable().await {
            Ok(()) => match stream.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            },
            Err(_) => break,
        };
        dec.push(&buf[..n]);
        loop {
            match dec.next_frame() {
                Ok(Some(frame)) => {
                    let record = match frame {
                        Frame::Hello(hello) => Record::GpuSource(GpuSource {
                            pid,
                            // The examples' simulated device speaks the
                            // shim's protocol and says who it is.
                            kind: if hello.source.starts_with("simulated") {
                                SourceKind::Simulated
                            } else {
                                SourceKind::Cupti
                            },
                            hello,
                        }),
                        Frame::Records(mut records) => {
                            host_ids.translate(&mut records);
                            end.saw(&records);
                            if let Some(r) = end.first_work(&records) {
                                if tx.send(r).is_err() {
                                    return;
                                }
                            }
                            Record::Gpu(GpuBatch { pid, records })
                        }
                        Frame::Dropped { cupti, shim } => Record::GpuDrops { pid, cupti, shim },
                        Frame::Lost {
                            start,
                            end,
                            records,
                        } => Record::GpuLost(crate::session::GpuLost {
                            pid,
                            start,
                            end,
                            records,
                        }),
                        Frame::Info(s) => Record::Note(format!("pid {pid}: {s}")),
                        Frame::Goodbye => {
                            end.goodbye = true;
                            continue;
                        }
                        Frame::Blind { start, reason } => {
                            let note = format!(
                                "pid {pid}: from {start} ns on, GPU activity could not be seen: {reason}"
                            );
                            end.blind.get_or_insert((start, reason));
                            Record::Note(note)
                        }
                        Frame::Sighted { at } if end.attached => {
                            // Recording began late: work queued before it runs
                            // first, unrecorded, so the GPU is known only from
                            // its first recorded work on.
                            end.sighted.get_or_insert(at);
                            continue;
                        }
                        Frame::Sighted { at } => match end.close_blind(at) {
                            Some(r) => r,
                            None => continue,
                        },
                        Frame::Skipped {
                            incomplete,
                            unknown,
                        } => Record::GpuSkipped {
                            pid,
                            incomplete,
                            unknown,
                        },
                    };
                    if tx.send(record).is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Record::Note(format!(
                        "the GPU stream from pid {pid} broke ({e}); its later records are missing"
                    )));
                    return;
                }
            }
        }
    }
}

/// How a GPU stream ended, said when it does (also when its task is
/// aborted at the end of a recording): a blind span still open is closed
/// there, and a stream that ends without a goodbye — the process was killed,
/// or left without its exit handlers — loses what ran after its last record.
struct StreamEnd {
    pid: u32,
    tx: UnboundedSender<Record>,
    opened: u64,
    last_record_end: u64,
    goodbye: bool,
    blind: Option<(u64, String)>,
    /// A dormant shim attached to: its initial blind span closes at its
    /// first recorded GPU work, not when it says it records.
    attached: bool,
    /// When it said it began recording.
    sighted: Option<u64>,
}

impl StreamEnd {
    fn saw(&mut self, records: &[gapscope_wire::GpuRecord]) {
        for r in records {
            if let Some((_, e)) = r.span() {
                self.last_record_end = self.last_record_end.max(e);
            }
        }
    }

    /// Closes an attached shim's initial blind span at the start of its
    /// first recorded GPU work (kernels, copies, memsets).
    fn first_work(&mut self, records: &[gapscope_wire::GpuRecord]) -> Option<Record> {
        use gapscope_wire::GpuRecord as G;
        let sighted = self.sighted?;
        let first = records
            .iter()
            .filter_map(|r| match r {
                G::Kernel { start, .. } | G::Memcpy { start, .. } | G::Memset { start, .. } => {
                    Some(*start)
                }
                _ => None,
            })
            .min()?;
        self.sighted = None;
        self.attached = false;
        self.close_blind(first.max(sighted))
    }

    fn close_blind(&mut self, at: u64) -> Option<Record> {
        let (start, reason) = self.blind.take()?;
        Some(Record::GpuBlind(crate::session::GpuBlind {
            pid: self.pid,
            start,
            end: at.max(start),
            reason,
        }))
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let now = gapscope_wire::clock::monotonic_ns();
        // Recording, and no work recorded: none was launched since.
        if let Some(r) = self.sighted.take().and_then(|at| self.close_blind(at)) {
            let _ = self.tx.send(r);
        }
        if let Some(r) = self.close_blind(now) {
            let _ = self.tx.send(r);
        }
        if !self.goodbye {
            let start = if self.last_record_end > 0 {
                self.last_record_end
            } else {
                self.opened
            };
            let _ = self.tx.send(Record::GpuBlind(crate::session::GpuBlind {
                pid: self.pid,
                start: start.min(now),
                end: now,
                reason: "its GPU stream ended without a goodbye (the process was killed, or \
                         left without running its exit handlers): what the GPU did after its \
                         last record is unknown"
                    .into(),
            }));
        }
    }
}

impl GpuStreams {
    pub fn new(tx: UnboundedSender<Record>) -> GpuStreams {
        GpuStreams {
            tasks: JoinSet::new(),
            tx,
            connected: HashSet::new(),
            attached: Vec::new(),
            stop_accepting: None,
            window_start: None,
        }
    }

    /// Attach: the recording began at `t` (CLOCK_MONOTONIC ns).
    pub fn attached_at(&mut self, t: u64) {
        self.window_start = Some(t);
    }

    /// Accepts shims of the tree under `root` (run); connections from
    /// elsewhere are refused.
    pub fn accept(&mut self, listener: GpuListener, root: u32) -> std::io::Result<()> {
        let listener = tokio::net::UnixListener::from_std(listener.listener)?;
        let tx = self.tx.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        self.stop_accepting = Some(stop);
        self.tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let stream = tokio::select! {
                    r = listener.accept() => match r {
                        Ok((stream, _)) => stream,
                        Err(_) => break,
                    },
                    _ = &mut stopped => break,
                };
                // Let go of the streams that have ended.
                while conns.try_join_next().is_some() {}
                match peer_pid(&stream) {
                    Some(pid) if in_tree(pid, root) => {
                        conns.spawn(serve(std::sync::Arc::new(stream), pid, tx.clone(), None));
                    }
                    other => {
                        let _ = tx.send(Record::Note(format!(
                            "refused a GPU stream from pid {other:?}: not in the recorded process tree"
                        )));
                    }
                }
            }
            // Streams end when their processes have flushed and exited.
            while conns.join_next().await.is_some() {}
        });
        Ok(())
    }

    /// Connects to the shim of each of `pids` that has one listening
    /// (attach), once per process. `pids` are the processes alive now: any
    /// other is forgotten (a pid used again is another process).
    pub fn connect(&mut self, pids: impl IntoIterator<Item = u32>) {
        // Processes there when recording began went unseen from then; later
        // ones from their connection.
        let first = self.window_start.take();
        let pids: HashSet<u32> = pids.into_iter().collect();
        self.connected.retain(|pid| pids.contains(pid));
        self.prune();
        for pid in pids {
            if self.connected.contains(&pid) {
                continue;
            }
            // Possibly in a container: the shim's name and network
            // namespace are its own.
            let Ok(std_stream) = pidns::connect_control(pid) else {
                continue;
            };
            let _ = std_stream.set_nonblocking(true);
            let Ok(stream) = UnixStream::from_std(std_stream) else {
                continue;
            };
            if peer_pid(&stream) != Some(pid) {
                continue;
            }
            self.connected.insert(pid);
            let stream = std::sync::Arc::new(stream);
            self.attached.push(std::sync::Arc::downgrade(&stream));
            let since = first.unwrap_or_else(gapscope_wire::clock::monotonic_ns);
            self.tasks
                .spawn(serve(stream, pid, self.tx.clone(), Some(since)));
        }
    }

    /// Lets go of the tasks and sockets of streams that have ended.
    fn prune(&mut self) {
        while self.tasks.try_join_next().is_some() {}
        self.attached.retain(|s| s.strong_count() > 0);
    }

    /// Lets the streams finish: attach-mode shims are asked to stop (they
    /// flush and close), then every stream gets `grace` to reach its end.
    pub async fn finish(mut self, grace: Duration) {
        for s in self.attached.iter().filter_map(std::sync::Weak::upgrade) {
            // SAFETY: shutting down the write half of a socket we hold.
            unsafe {
                libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&*s), libc::SHUT_WR);
            }
        }
        if let Some(stop) = self.stop_accepting.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Attach to a tree whose CUDA processes come and go: the streams of
    /// those that ended are let go (task, socket) and their pids forgotten.
    #[test]
    fn ended_streams_are_let_go() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut streams = GpuStreams::new(tx);
            const PROCESSES: u32 = 2_000;
            const AT_ONCE: u32 = 50;
            let mut most = 0;
            for round in 0..PROCESSES / AT_ONCE {
                let mut ours = Vec::new();
                for k in 0..AT_ONCE {
                    // Pids no process has; each stream's process exits at once.
                    let pid = 50_000_000 + round * AT_ONCE + k;
                    let (a, b) = UnixStream::pair().unwrap();
                    let a = Arc::new(a);
                    streams.connected.insert(pid);
                    streams.attached.push(Arc::downgrade(&a));
                    streams.tasks.spawn(serve(a, pid, streams.tx.clone(), None));
                    ours.push(b);
                }
                drop(ours);
                for _ in 0..200 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    streams.connect(std::iter::empty());
                    if streams.tasks.is_empty() {
                        break;
                    }
                }
                most = most.max(streams.tasks.len() + streams.attached.len());
                assert!(streams.connected.is_empty());
                while rx.try_recv().is_ok() {}
            }
            assert!(most < AT_ONCE as usize, "{most}");
            assert!(streams.attached.is_empty());
        });
    }
}
