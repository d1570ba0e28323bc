//! gs-synth: writes a synthetic gapscope session of a given number of
//! events, for the offline benchmarks (`gapscope report` speed and memory
//! on sessions far larger than a test can record). It models a training
//! job: four loader processes reading a file and handing batches over pipes
//! to a trainer that launches kernels on a GPU and synchronizes every step,
//! with the scheduler, syscall, sample and GPU records a recording of such a
//! job holds, in the same proportions and order. SYNTHETIC: its session
//! says so in its command line and its GPU source.
//!
//! Records go to the file as they are made (the writer compresses a chunk
//! of about 256 KiB at a time; GPU records wait in batches of 512), so
//! memory stays a few MiB at any size: 100 M events take about 10 s and
//! 660 MiB of disk. Its last line on stderr gives the counts written:
//! `gs-synth: N events: C CPU events, G GPU records (S steps) in PATH`.

use std::path::PathBuf;
use std::sync::Arc;

use gapscope::analyze::cbid_of;
use gapscope::session::{
    Event, FdKind, Footer, Frame, GpuBatch, GpuSource, Mode, ProcessInfo, Record, SessionHeader,
    SessionWriter, StopReason, SwitchOut, Symbols,
};
use gapscope_wire::record::ApiDomain;
use gapscope_wire::{ClockMethod, GpuRecord, Hello};

const TRAINER: u32 = 1000;
const LOADERS: u32 = 4;
const NR_READ: i32 = 0;
const NR_WRITE: i32 = 1;
const NR_IOCTL: i32 = 16;
const NR_PREAD64: i32 = 17;
const TASK_INTERRUPTIBLE: u64 = 1;
const STACK_LOADER: u64 = 0x1001;
const STACK_TRAINER: u64 = 0x1002;

fn die(msg: &str) -> ! {
    eprintln!("gs-synth: {msg}");
    std::process::exit(2);
}

struct Gen {
    w: SessionWriter,
    /// CPU events and GPU records written (or batched) so far.
    events: u64,
    gpu_records: u64,
    gpu: Vec<GpuRecord>,
    rng: u64,
}

impl Gen {
    fn push(&mut self, r: Record) {
        self.w
            .push(&r)
            .unwrap_or_else(|e| die(&format!("writing: {e}")));
    }

    fn ev(&mut self, e: Event) {
        self.events += 1;
        self.push(Record::Event(e));
    }

    fn gpu(&mut self, r: GpuRecord) {
        self.events += 1;
        self.gpu_records += 1;
        self.gpu.push(r);
        if self.gpu.len() == 512 {
            self.flush_gpu();
        }
    }

    fn flush_gpu(&mut self) {
        let records = std::mem::take(&mut self.gpu);
        if !records.is_empty() {
            self.push(Record::Gpu(GpuBatch {
                pid: TRAINER,
                records,
            }));
        }
    }

    /// A few µs of jitter, deterministic.
    fn jitter(&mut self, max: u64) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.rng >> 33) % max.max(1)
    }

    fn switch(&mut self, ts: u64, cpu: u16, out: Option<SwitchOut>, in_: Option<(u32, u32)>) {
        self.ev(Event::Switch { ts, cpu, out, in_ });
    }

    #[allow(clippy::too_many_arguments)]
    fn syscall(&mut self, ts: u64, pid: u32, nr: i32, dur: u64, fd: i32, kind: FdKind, ret: i64) {
        self.ev(Event::Syscall {
            ts,
            pid,
            tid: pid,
            dur,
            nr,
            fd,
            fd_kind: kind,
            ret,
        });
    }
}

fn blocked(pid: u32, nr: i32, fd: i32, kind: FdKind, ustack: u64) -> SwitchOut {
    SwitchOut {
        pid,
        tid: pid,
        state: TASK_INTERRUPTIBLE,
        preempted: false,
        ustack,
        kstack: 0,
        syscall: Some(nr),
        fd,
        fd_kind: kind,
        next: (0, 0),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(n)) = (args.first(), args.get(1)) else {
        die("usage: gs-synth SESSION_PATH EVENTS");
    };
    let target: u64 = n
        .parse()
        .unwrap_or_else(|_| die(&format!("not a number: {n}")));
    let path = PathBuf::from(path);
    let w = SessionWriter::create(&path).unwrap_or_else(|e| die(&format!("{e}")));
    let mut g = Gen {
        w,
        events: 0,
        gpu_records: 0,
        gpu: Vec::new(),
        rng: 0x9e3779b97f4a7c15,
    };
    let start: u64 = 1_000_000_000_000;
    g.push(Record::Header(SessionHeader {
        gapscope_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: Mode::Run,
        target_pid: TRAINER,
        command: vec!["gs-synth".into(), "SYNTHETIC".into(), format!("{target}")],
        hostname: "synthetic".into(),
        kernel: "synthetic".into(),
        nr_cpus: 2,
        start_ns: start,
        start_unix_ns: 1_795_000_000_000_000_000,
        sample_hz: 99,
    }));
    g.push(Record::Process(ProcessInfo {
        pid: TRAINER,
        ppid: 1,
        comm: "trainer".into(),
        argv: vec!["gs-synth".into(), "SYNTHETIC".into()],
    }));
    g.push(Record::GpuSource(GpuSource {
        pid: TRAINER,
        kind: gapscope::session::SourceKind::Simulated,
        hello: Hello {
            version: gapscope_wire::protocol::VERSION,
            pid: TRAINER,
            driver_version: 0,
            cupti_version: 0,
            clock: ClockMethod::Native,
            source: "gs-synth: SYNTHETIC session for benchmarks".into(),
        },
    }));
    let mut ts = start + 1_000;
    for l in 1..=LOADERS {
        let pid = TRAINER + l;
        g.ev(Event::Fork {
            ts,
            pid,
            tid: pid,
            parent_pid: TRAINER,
            parent_tid: TRAINER,
            thread: false,
            comm: "loader".into(),
        });
        g.push(Record::Process(ProcessInfo {
            pid,
            ppid: TRAINER,
            comm: "loader".into(),
            argv: vec![],
        }));
        ts += 1_000;
    }
    let launch = cbid_of(ApiDomain::Runtime, "cudaLaunchKernel").unwrap_or(211);
    let sync = cbid_of(ApiDomain::Runtime, "cudaStreamSynchronize").unwrap_or(131);
    let kernel_name: Arc<str> = Arc::from("synthetic_gemm_kernel");
    let mut corr: u32 = 0;
    let mut step: u64 = 0;
    while g.events < target {
        let loader = TRAINER + 1 + (step % LOADERS as u64) as u32;
        // The loader wakes, reads a batch in small reads, hands it over.
        g.ev(Event::Wakeup {
            ts,
            pid: loader,
            tid: loader,
            waker_pid: TRAINER,
            waker_tid: TRAINER,
            new_task: false,
        });
        ts += 5_000 + g.jitter(2_000);
        g.switch(ts, 1, None, Some((loader, loader)));
        for _ in 0..8 {
            ts += 2_000;
            let dur = 3_000 + g.jitter(1_000);
            g.syscall(ts, loader, NR_PREAD64, dur, 5, FdKind::File, 65_536);
            ts += dur;
        }
        if step.is_multiple_of(8) {
            g.ev(Event::Sample {
                ts,
                pid: loader,
                tid: loader,
                cpu: 1,
                ustack: STACK_LOADER,
                kstack: 0,
            });
        }
        ts += 150_000 + g.jitter(50_000); // decode
        g.syscall(ts, loader, NR_WRITE, 4_000, 7, FdKind::Pipe, 8);
        ts += 4_000;
        g.switch(
            ts,
            1,
            Some(blocked(loader, NR_READ, 6, FdKind::Pipe, STACK_LOADER)),
            None,
        );

        // The trainer takes the batch, launches four kernels, synchronizes.
        g.ev(Event::Wakeup {
            ts,
            pid: TRAINER,
            tid: TRAINER,
            waker_pid: loader,
            waker_tid: loader,
            new_task: false,
        });
        ts += 4_000;
        g.switch(ts, 0, None, Some((TRAINER, TRAINER)));
        g.syscall(ts, TRAINER, NR_READ, 3_000, 8, FdKind::Pipe, 8);
        ts += 10_000;
        let mut gpu_at = ts + 20_000;
        for _ in 0..4 {
            corr += 1;
            g.gpu(GpuRecord::Api {
                domain: ApiDomain::Runtime,
                cbid: launch,
                start: ts,
                end: ts + 6_000,
                pid: TRAINER,
                tid: TRAINER,
                correlation: corr,
            });
            let k_start = gpu_at.max(ts + 8_000);
            let k_end = k_start + 200_000 + g.jitter(40_000);
            g.gpu(GpuRecord::Kernel {
                start: k_start,
                end: k_end,
                device: 0,
                context: 1,
                stream: 7,
                correlation: corr,
                grid: [128, 1, 1],
                block: [256, 1, 1],
                name: kernel_name.clone(),
            });
            gpu_at = k_end;
            ts += 10_000;
        }
        corr += 1;
        g.gpu(GpuRecord::Api {
            domain: ApiDomain::Runtime,
            cbid: sync,
            start: ts,
            end: gpu_at + 5_000,
            pid: TRAINER,
            tid: TRAINER,
            correlation: corr,
        });
        g.syscall(
            ts + 1_000,
            TRAINER,
            NR_IOCTL,
            gpu_at - ts,
            9,
            FdKind::Gpu,
            0,
        );
        g.switch(
            ts + 2_000,
            0,
            Some(blocked(TRAINER, NR_IOCTL, 9, FdKind::Gpu, STACK_TRAINER)),
            None,
        );
        g.ev(Event::Wakeup {
            ts: gpu_at + 3_000,
            pid: TRAINER,
            tid: TRAINER,
            waker_pid: 0,
            waker_tid: 0,
            new_task: false,
        });
        g.switch(gpu_at + 4_000, 0, None, Some((TRAINER, TRAINER)));
        ts = gpu_at + 30_000 + g.jitter(20_000); // optimizer step on the host
        g.switch(
            ts,
            0,
            Some(blocked(TRAINER, NR_READ, 8, FdKind::Pipe, STACK_TRAINER)),
            None,
        );
        step += 1;
    }
    g.flush_gpu();
    let frame = |f: &str| Frame {
        function: f.into(),
        module: "gs-synth".into(),
    };
    g.push(Record::Symbols(Symbols {
        frames: vec![
            frame("read_batch"),
            frame("loader_main"),
            frame("train_step"),
            frame("main"),
        ],
        stacks: vec![(STACK_LOADER, vec![0, 1, 3]), (STACK_TRAINER, vec![2, 3])],
    }));
    let events = g.events;
    g.push(Record::End(Footer {
        end_ns: ts + 1_000,
        reason: StopReason::TargetExited,
        exit_code: Some(0),
        events,
    }));
    g.w.finish().unwrap_or_else(|e| die(&format!("{e}")));
    let gpu = g.gpu_records;
    eprintln!(
        "gs-synth: {events} events: {} CPU events, {gpu} GPU records ({step} steps) in {}",
        events - gpu,
        path.display()
    );
}
