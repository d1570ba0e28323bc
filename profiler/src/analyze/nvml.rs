//! What NVML said over a recording, per GPU: mean utilization (what
//! dashboards show), energy used, and the energy burnt while idle.

use crate::session::Session;

/// What NVML said about one GPU over the recording.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlFigures {
    /// Mean utilization.gpu, as dashboards show it.
    pub util_pct: Option<f64>,
    /// Energy used over the window, joules.
    pub energy_j: Option<f64>,
    /// Of which burnt while the GPU was idle.
    pub idle_energy_j: Option<f64>,
}

/// NVML's figures for GPU `index` over `[start, end]`, given its busy spans.
pub fn figures(
    session: &Session,
    index: u32,
    busy: &[(u64, u64)],
    start: u64,
    end: u64,
) -> NvmlFigures {
    let (util_pct, energy_j) = nvml_for(session, index, start, end);
    NvmlFigures {
        util_pct,
        energy_j,
        idle_energy_j: idle_energy_j(session, index, busy, start, end),
    }
}

/// Power integrated over the GPU's idle time: each NVML power reading stands
/// for the time until the next one.
pub fn idle_energy_j(
    session: &Session,
    index: u32,
    busy: &[(u64, u64)],
    start: u64,
    end: u64,
) -> Option<f64> {
    let samples: Vec<(u64, u32)> = session
        .nvml
        .iter()
        .filter(|s| s.index == index && s.ts <= end)
        .filter_map(|s| s.power_mw.map(|p| (s.ts.max(start), p)))
        .collect();
    if samples.is_empty() {
        return None;
    }
    let mut joules = 0.0;
    for (i, &(t0, mw)) in samples.iter().enumerate() {
        let t1 = samples.get(i + 1).map(|s| s.0).unwrap_or(end).min(end);
        if t1 <= t0 {
            continue;
        }
        let busy_in = crate::intervals::total(&crate::intervals::clip(busy, t0, t1));
        let idle_ns = (t1 - t0) - busy_in;
        joules += mw as f64 / 1000.0 * idle_ns as f64 / 1e9;
    }
    Some(joules)
}

/// Mean utilization.gpu and energy used over the window for one GPU.
pub fn nvml_for(session: &Session, index: u32, start: u64, end: u64) -> (Option<f64>, Option<f64>) {
    let samples: Vec<_> = session
        .nvml
        .iter()
        .filter(|s| s.index == index && s.ts >= start && s.ts <= end)
        .collect();
    let utils: Vec<u32> = samples.iter().filter_map(|s| s.util_gpu).collect();
    let util = (!utils.is_empty())
        .then(|| utils.iter().map(|&u| u as f64).sum::<f64>() / utils.len() as f64);
    let energies: Vec<u64> = samples.iter().filter_map(|s| s.energy_mj).collect();
    let energy = match (energies.first(), energies.last()) {
        (Some(a), Some(b)) if b > a => Some((b - a) as f64 / 1000.0),
        _ => None,
    };
    (util, energy)
}
