//! NVML sampler: what dashboards show (utilization.gpu, memory, power,
//! energy, SM clock) at a fixed rate, so the report can set it beside what
//! the GPU actually did. No NVML (no NVIDIA driver) is one note, not an error.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::Nvml;
use tokio::sync::mpsc::UnboundedSender;

use crate::clock;
use crate::session::{NvmlDevice, NvmlSample, Record};

pub const DEFAULT_HZ: u64 = 10;

/// The processes NVML says run on any GPU of this machine (compute and
/// graphics contexts), as pids of the host's pid namespace; None without
/// NVML. NVML is opened once per process and kept: loading the library
/// each time an agent looks would cost more than the look.
pub fn gpu_pids() -> Option<HashSet<u32>> {
    static NVML: std::sync::OnceLock<Option<Nvml>> = std::sync::OnceLock::new();
    let nvml = NVML.get_or_init(|| Nvml::init().ok()).as_ref()?;
    let mut pids = HashSet::new();
    for index in 0..nvml.device_count().unwrap_or(0) {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        for list in [
            d.running_compute_processes(),
            d.running_graphics_processes(),
        ] {
            pids.extend(list.unwrap_or_default().into_iter().map(|p| p.pid));
        }
    }
    Some(pids)
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling every GPU at `hz`. `pids` is the live process tree,
    /// whose per-process utilization is kept (no one else's).
    pub fn start(hz: u64, pids: Arc<RwLock<HashSet<u32>>>, tx: UnboundedSender<Record>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gapscope-nvml".into())
            .spawn(move || run(hz.max(1), pids, tx, flag))
            .ok();
        Sampler { stop, thread }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    hz: u64,
    pids: Arc<RwLock<HashSet<u32>>>,
    tx: UnboundedSender<Record>,
    stop: Arc<AtomicBool>,
) {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            let _ = tx.send(Record::Note(format!(
                "NVML is not available ({e}): no utilization, power or energy readings"
            )));
            return;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut devices = Vec::new();
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        let _ = tx.send(Record::NvmlDevice(NvmlDevice {
            index,
            name: d.name().unwrap_or_default(),
            uuid: d.uuid().unwrap_or_default(),
            memory_total: d.memory_info().map(|m| m.total).unwrap_or(0),
        }));
        devices.push((index, d, 0u64));
    }
    let period = Duration::from_nanos(1_000_000_000 / hz);
    while !stop.load(Ordering::Relaxed) {
        for (index, d, last_seen) in devices.iter_mut() {
            let util = d.utilization_rates().ok();
            let tree = pids.read().map(|p| p.clone()).unwrap_or_default();
            let processes: Vec<(u32, u32)> = d
                .process_utilization_stats(Some(*last_seen))
                .map(|samples| {
                    samples
                        .into_iter()
                        .filter(|s| tree.contains(&s.pid))
                        .map(|s| {
                            *last_seen = (*last_seen).max(s.timestamp);
                            (s.pid, s.sm_util)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let sample = NvmlSample {
                ts: clock::monotonic_ns(),
                index: *index,
                util_gpu: util.as_ref().map(|u| u.gpu),
                util_memory: util.as_ref().map(|u| u.memory),
                memory_used: d.memory_info().ok().map(|m| m.used),
                power_mw: d.power_usage().ok(),
                energy_mj: d.total_energy_consumption().ok(),
                sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                processes,
            };
            if tx.send(Record::Nvml(sample)).is_err() {
                return;
            }
        }
        std::thread::sleep(period);
    }
}
