//! The agent's counters, and their Prometheus text exposition (format
//! 0.0.4): per job and GPU, the seconds allocated, busy and idle, and idle
//! by cause; per job, what was recorded; the agent's own CPU and drops.
//! Counters only grow: a job that ends keeps its last values for
//! [`ENDED_KEPT`] so that a scrape after its end still sees them, then goes.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use super::labels::Labels;
use crate::analyze::cause::Cause;
use crate::export::Report;

/// How long an ended job's counters stay exposed.
pub const ENDED_KEPT: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, Default)]
struct Gpu {
    name: String,
    allocated_ns: u64,
    busy_ns: u64,
    idle_ns: u64,
    unseen_ns: u64,
    by_cause: BTreeMap<Cause, u64>,
    /// Requests its server answered (where it serves).
    requests: u64,
    /// Of its latest window, the share it waited for requests (`demand`).
    waiting_for_work: f64,
}

#[derive(Clone, Debug)]
struct Job {
    labels: Labels,
    gpus: BTreeMap<u32, Gpu>,
    windows: u64,
    recorded_ns: u64,
    dropped_events: u64,
    last_seen: Instant,
    /// How long its latest window was: a job not seen for two of them has
    /// ended, and its GPUs wait for nothing.
    window: Duration,
}

#[derive(Debug, Default)]
pub struct Metrics {
    jobs: BTreeMap<String, Job>,
    /// Windows that could not be recorded or read.
    pub failed_windows: u64,
}

impl Metrics {
    /// Adds one recorded window of job `key`: its report and its lost
    /// events.
    pub fn add_window(&mut self, key: &str, labels: &Labels, r: &Report, dropped: u64) {
        let job = self.jobs.entry(key.to_string()).or_insert_with(|| Job {
            labels: labels.clone(),
            gpus: BTreeMap::new(),
            windows: 0,
            recorded_ns: 0,
            dropped_events: 0,
            last_seen: Instant::now(),
            window: Duration::ZERO,
        });
        job.windows += 1;
        job.recorded_ns += r.window_ns.end.saturating_sub(r.window_ns.start);
        job.dropped_events += dropped;
        job.last_seen = Instant::now();
        job.window = Duration::from_nanos(r.window_ns.end.saturating_sub(r.window_ns.start));
        for g in &r.gpus {
            let c = job.gpus.entry(g.id).or_default();
            c.name.clone_from(&g.name);
            c.allocated_ns += g.allocated_ns;
            c.busy_ns += g.busy_ns;
            c.idle_ns += g.idle_ns;
            c.unseen_ns += g.unseen_ns;
            for (cause, ns) in g.idle_by_cause_ns.entries() {
                *c.by_cause.entry(cause).or_default() += ns;
            }
            c.requests += g.requests.as_ref().map_or(0, |q| q.count);
            c.waiting_for_work =
                g.idle_by_cause_ns.get(Cause::Demand) as f64 / g.allocated_ns.max(1) as f64;
        }
    }

    /// Lets go of jobs not seen for [`ENDED_KEPT`].
    pub fn forget_ended(&mut self) {
        self.jobs.retain(|_, j| j.last_seen.elapsed() < ENDED_KEPT);
    }

    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// The exposition, with the agent's own CPU time and lost events.
    pub fn exposition(&self, agent_cpu_ns: u64, version: &str) -> String {
        let mut out = String::new();
        let s = |ns: u64| ns as f64 / 1e9;
        family(
            &mut out,
            "gapscope_agent_info",
            "gauge",
            "The agent's version (always 1).",
        );
        sample(
            &mut out,
            "gapscope_agent_info",
            &[("version", version.to_string())],
            1.0,
        );
        family(
            &mut out,
            "gapscope_agent_cpu_seconds_total",
            "counter",
            "CPU time the agent itself used, recording and analysing included.",
        );
        sample(
            &mut out,
            "gapscope_agent_cpu_seconds_total",
            &[],
            s(agent_cpu_ns),
        );
        family(
            &mut out,
            "gapscope_agent_failed_windows_total",
            "counter",
            "Recording windows that could not be recorded or read.",
        );
        sample(
            &mut out,
            "gapscope_agent_failed_windows_total",
            &[],
            self.failed_windows as f64,
        );
        family(
            &mut out,
            "gapscope_agent_jobs",
            "gauge",
            "Jobs whose counters are exposed (followed now or ended within the hour).",
        );
        sample(&mut out, "gapscope_agent_jobs", &[], self.jobs.len() as f64);

        type Pick = fn(&Job) -> f64;
        let per_job: [(&str, &str, Pick); 3] = [
            (
                "gapscope_recording_windows_total",
                "Recording windows of the job analysed.",
                |j| j.windows as f64,
            ),
            (
                "gapscope_recorded_seconds_total",
                "Wall time of the job recorded (the windows' sum; the short gaps between windows are not seen).",
                |j| j.recorded_ns as f64 / 1e9,
            ),
            (
                "gapscope_dropped_events_total",
                "Kernel events of the job lost while recording (the ring buffer was full).",
                |j| j.dropped_events as f64,
            ),
        ];
        for (name, help, pick) in per_job {
            family(&mut out, name, "counter", help);
            for j in self.jobs.values() {
                sample(&mut out, name, &labels(j, None), pick(j));
            }
        }

        // The fleet's picture of serving: GPUs held and waiting for work.
        let name = "gapscope_gpus_waiting_for_work";
        family(
            &mut out,
            name,
            "gauge",
            "GPUs' worth of time, over the jobs followed now, spent waiting for requests (the demand cause) in each job's latest window: capacity held and not offered work.",
        );
        let waiting: f64 = self
            .jobs
            .values()
            .filter(|j| j.last_seen.elapsed() < 2 * j.window)
            .flat_map(|j| j.gpus.values())
            .map(|g| g.waiting_for_work)
            .sum();
        sample(&mut out, name, &[], waiting);

        type GpuPick = fn(&Gpu) -> f64;
        let per_gpu: [(&str, &str, GpuPick); 5] = [
            (
                "gapscope_gpu_allocated_seconds_total",
                "GPU time held by the job while recorded.",
                |g| g.allocated_ns as f64 / 1e9,
            ),
            (
                "gapscope_gpu_busy_seconds_total",
                "GPU time running the job's kernels, copies or memsets.",
                |g| g.busy_ns as f64 / 1e9,
            ),
            (
                "gapscope_gpu_idle_seconds_total",
                "GPU time held by the job and idle.",
                |g| g.idle_ns as f64 / 1e9,
            ),
            (
                "gapscope_gpu_unseen_seconds_total",
                "GPU time held by the job that could not be seen (before the job's GPU recording began, or while another CUPTI client held CUPTI): neither busy nor idle; busy + idle + unseen = allocated.",
                |g| g.unseen_ns as f64 / 1e9,
            ),
            (
                "gapscope_gpu_requests_total",
                "Requests the job's server answered on the GPU, where it waits for requests in a server's request loop (0 for training).",
                |g| g.requests as f64,
            ),
        ];
        for (name, help, pick) in per_gpu {
            family(&mut out, name, "counter", help);
            for j in self.jobs.values() {
                for (id, g) in &j.gpus {
                    sample(&mut out, name, &labels(j, Some((*id, g))), pick(g));
                }
            }
        }
        let name = "gapscope_gpu_idle_by_cause_seconds_total";
        family(
            &mut out,
            name,
            "counter",
            "GPU idle time by its cause (input.io, input.cpu, sync, cpu.host...); the causes sum to the idle time.",
        );
        for j in self.jobs.values() {
            for (id, g) in &j.gpus {
                for c in Cause::ALL {
                    let mut l = labels(j, Some((*id, g)));
                    l.push(("cause", c.name().to_string()));
                    l.sort();
                    sample(
                        &mut out,
                        name,
                        &l,
                        s(g.by_cause.get(&c).copied().unwrap_or(0)),
                    );
                }
            }
        }
        out
    }
}

/// A job's labels, and a GPU's.
fn labels(j: &Job, gpu: Option<(u32, &Gpu)>) -> Vec<(&'static str, String)> {
    let mut l: Vec<(&'static str, String)> =
        j.labels.iter().map(|(k, v)| (*k, v.clone())).collect();
    if let Some((id, g)) = gpu {
        l.push(("gpu", id.to_string()));
        l.push(("gpu_name", g.name.clone()));
    }
    l.sort();
    l
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP {name} {}",
        help.replace('\\', "\\\\").replace('\n', "\\n")
    );
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, String)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(
            &mut out,
            "x_total",
            &[("command", "a\"b\\c\nd".into())],
            1.5,
        );
        assert_eq!(out, "x_total{command=\"a\\\"b\\\\c\\nd\"} 1.5\n");
    }

    /// The golden recording's report, its GPU made a server's: a third of
    /// its held time waiting for requests, 40 of them answered.
    fn serving_window() -> Report {
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/golden/simtrain-mixed.gsz");
        let a = crate::analyze::analyze(golden, &Default::default()).unwrap();
        let mut r = crate::export::View::new(&a).report;
        let g = &mut r.gpus[0];
        let third = g.allocated_ns / 3;
        g.idle_by_cause_ns = crate::analyze::cause::IdleByCause::from_fn(|c| match c {
            Cause::Demand => third,
            _ => 0,
        });
        g.requests = Some(crate::export::report::RequestsReport {
            count: 40,
            span_ns: g.allocated_ns,
            rate_per_s: 1.0,
            latency_p50_ns: 1,
            latency_p99_ns: 1,
            latency_max_ns: 1,
            gpu_busy_per_request_ns: 1,
            energy_per_request_j: None,
        });
        r
    }

    /// A sample's value in an exposition, by its line's start.
    fn value(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_servers_requests_and_its_wait_for_work_are_exposed() {
        let r = serving_window();
        let mut m = Metrics::default();
        let labels: Labels = [("workload", "serve".to_string())].into_iter().collect();
        m.add_window("serve", &labels, &r, 0);
        m.add_window("serve", &labels, &r, 0);
        let text = m.exposition(0, "0.1.0");
        // Requests add up over windows; the wait for work is the latest
        // window's, a third of a GPU.
        assert_eq!(value(&text, "gapscope_gpu_requests_total{"), 80.0);
        let waiting = value(&text, "gapscope_gpus_waiting_for_work ");
        assert!((waiting - 1.0 / 3.0).abs() < 1e-3, "{waiting}");
        // A job not seen for two of its windows has ended: it waits for
        // nothing.
        let job = m.jobs.get_mut("serve").unwrap();
        job.last_seen -= 3 * job.window;
        let text = m.exposition(0, "0.1.0");
        assert_eq!(value(&text, "gapscope_gpus_waiting_for_work "), 0.0);
    }

    #[test]
    fn an_empty_agent_still_says_who_it_is() {
        let m = Metrics::default();
        let text = m.exposition(1_500_000_000, "0.1.0");
        assert!(text.contains("gapscope_agent_info{version=\"0.1.0\"} 1\n"));
        assert!(text.contains("gapscope_agent_cpu_seconds_total 1.5\n"));
        assert!(text.contains("# TYPE gapscope_gpu_idle_by_cause_seconds_total counter\n"));
    }
}
