//! The human summaries (text for terminals, markdown for issues and chats).
//! Both show the same content, built once here as sections of lines and
//! tables; only the layout differs.

use std::io::{self, Write};

use super::document::{self, Block, Style, Table};
use super::report::{IdleCost, Report, StackReport, ThreadReport};
use super::units;
use super::{Format, Options, View};
use crate::session::SourceKind;
use crate::timeline::OffKind;

/// Most threads listed in the per-thread table; the JSON has all.
const MAX_THREAD_ROWS: usize = 40;
/// Frames shown per stack.
const MAX_FRAMES: usize = 8;
/// Threads listed in the bytes and syscall sections.
const MAX_DETAIL_THREADS: usize = 10;

/// The text or markdown report, with HTA's table where it was asked for.
pub fn write(v: &View, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let style = match opts.format {
        Format::Markdown => Style::Markdown,
        _ => Style::Text,
    };
    write_summary(&v.report, style, &mut *out)?;
    if let Some(h) = &v.analysis.hta {
        super::ranks::write_hta(h, out)?;
    }
    Ok(())
}

pub fn write_summary(report: &Report, style: Style, mut out: impl Write) -> io::Result<()> {
    for block in blocks(report) {
        document::write_block(&block, style, &mut out)?;
    }
    Ok(())
}

fn blocks(r: &Report) -> Vec<Block> {
    let mut b = document::heading(r).blocks();
    b.push(Block::Line(drops_line(r)));
    for blind in &r.drops.gpu_blind {
        b.push(Block::Line(format!(
            "GPU not seen: pid {} for {} (+{} from the start): {}; counted as lost, not idle",
            blind.pid,
            units::duration(blind.end_ns.saturating_sub(blind.start_ns)),
            units::duration(blind.start_ns.saturating_sub(r.window_ns.start)),
            blind.reason
        )));
    }
    gpu_blocks(r, &mut b);
    advice_blocks(r, &mut b);
    stage_blocks(r, &mut b);

    if !r.threads.is_empty() {
        b.push(Block::Heading(
            "Where each thread's time went (share of its lifetime)".into(),
        ));
        b.push(Block::Table(thread_table(r)));
    }

    let mut by_bytes: Vec<&ThreadReport> = r.threads.iter().collect();
    by_bytes.sort_by_key(|t| std::cmp::Reverse(moved(t)));
    let io: Vec<String> = by_bytes
        .into_iter()
        .take(MAX_DETAIL_THREADS)
        .filter_map(|t| Some(format!("{}: {}", who(t), bytes_moved(t)?)))
        .collect();
    if !io.is_empty() {
        b.push(Block::Heading("Bytes moved".into()));
        b.push(Block::Bullets(io));
    }

    let mut by_sys: Vec<&ThreadReport> = r.threads.iter().collect();
    by_sys.sort_by_key(|t| std::cmp::Reverse(t.syscalls.iter().map(|s| s.total_ns).sum::<u64>()));
    let sys: Vec<String> = by_sys
        .into_iter()
        .take(MAX_DETAIL_THREADS)
        .filter(|t| !t.syscalls.is_empty())
        .map(|t| {
            let calls: Vec<String> = t
                .syscalls
                .iter()
                .take(4)
                .map(|s| {
                    format!(
                        "{} ×{} {} (max {})",
                        s.name,
                        units::count(s.count),
                        units::duration(s.total_ns),
                        units::duration(s.max_ns)
                    )
                })
                .collect();
            format!("{}: {}", who(t), calls.join(" · "))
        })
        .collect();
    if !sys.is_empty() {
        b.push(Block::Heading("Top syscalls by time".into()));
        b.push(Block::Bullets(sys));
    }

    let code = code_lines(r);
    if !code.is_empty() {
        b.push(Block::Heading(
            "Time on a CPU by code (share of each thread's samples)".into(),
        ));
        b.push(Block::Bullets(code));
    }

    let on = top_stacks(r, |t| &t.on_cpu_stacks);
    if !on.is_empty() {
        b.push(Block::Heading(format!(
            "Top on-CPU stacks (sampled at {} Hz)",
            r.session.sample_hz
        )));
        b.push(Block::Bullets(on));
    }
    let off = top_stacks(r, |t| &t.off_cpu_stacks);
    if !off.is_empty() {
        b.push(Block::Heading("Top off-CPU stacks (blocked time)".into()));
        b.push(Block::Bullets(off));
    }
    if !r.notes.is_empty() {
        b.push(Block::Heading("Notes".into()));
        b.push(Block::Bullets(r.notes.clone()));
    }
    b
}

fn total(x: &super::report::BytesReport) -> u64 {
    x.file + x.net + x.ipc + x.other
}

/// Bytes a thread moved: by kind of descriptor where each syscall was
/// recorded, else as the kernel's accounting counted them.
fn moved(t: &ThreadReport) -> u64 {
    match total(&t.read_bytes) + total(&t.write_bytes) {
        0 => t.io.as_ref().map_or(0, |io| io.read_chars + io.write_chars),
        n => n,
    }
}

fn bytes_moved(t: &ThreadReport) -> Option<String> {
    let (rd, wr) = (total(&t.read_bytes), total(&t.write_bytes));
    if rd + wr > 0 {
        let parts = |x: &super::report::BytesReport| {
            [
                ("file", x.file),
                ("net", x.net),
                ("ipc", x.ipc),
                ("other", x.other),
            ]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k} {}", units::bytes(*n)))
            .collect::<Vec<_>>()
            .join(", ")
        };
        let mut line = Vec::new();
        if rd > 0 {
            line.push(format!("read {}", parts(&t.read_bytes)));
        }
        if wr > 0 {
            line.push(format!("wrote {}", parts(&t.write_bytes)));
        }
        return Some(line.join(" · "));
    }
    let io =
        t.io.as_ref()
            .filter(|io| io.read_chars + io.write_chars > 0)?;
    let mut line = Vec::new();
    for (verb, chars, calls, storage) in [
        ("read", io.read_chars, io.read_calls, io.storage_read_bytes),
        (
            "wrote",
            io.write_chars,
            io.write_calls,
            io.storage_write_bytes,
        ),
    ] {
        if chars > 0 {
            let mut part = format!(
                "{verb} {} in {} calls",
                units::bytes(chars),
                units::count(calls)
            );
            if storage > 0 {
                part += &format!(
                    " ({} {} storage)",
                    units::bytes(storage),
                    if verb == "read" { "from" } else { "to" }
                );
            }
            line.push(part);
        }
    }
    Some(line.join(" · ") + " (kernel accounting)")
}

/// The idle time as a team budgets it.
pub fn idle_cost_line(c: &IdleCost) -> String {
    let energy = c
        .idle_energy_j
        .map(|j| format!("; {:.1} kJ burnt while idle", j / 1000.0))
        .unwrap_or_default();
    format!(
        "Idle cost: {:.2} GPUs' worth of held time did nothing — {:.1} GPU-hours a day at this pace{energy}.",
        c.equivalent_gpus, c.gpu_hours_per_day
    )
}

fn advice_blocks(r: &Report, b: &mut Vec<Block>) {
    let Some(verdict) = &r.verdict else { return };
    b.push(Block::Heading("Diagnosis".into()));
    b.push(Block::Line(verdict.clone()));
    if let Some(c) = &r.idle_cost {
        b.push(Block::Line(idle_cost_line(c)));
    }
    let before = r.window_ns.end.saturating_sub(r.window_ns.start);
    for (i, rec) in r.recommendations.iter().enumerate() {
        b.push(Block::Line(format!(
            "{}. [{}] {} — {}",
            i + 1,
            rec.cause,
            rec.gain(),
            rec.title
        )));
        let mut bullets = rec.what_if_lines(before, r.gpus.len());
        bullets.extend(rec.evidence.iter().cloned());
        b.push(Block::Bullets(bullets));
    }
}

/// The input pipeline by stage, slowest first, with its top functions.
fn stage_blocks(r: &Report, b: &mut Vec<Block>) {
    let Some(st) = &r.input_stages else { return };
    b.push(Block::Heading(format!(
        "Input pipeline by stage ({} thread(s) ran input code)",
        st.threads
    )));
    let lines = st
        .stages
        .iter()
        .map(|s| {
            let what = if s.stage == "read" {
                "blocked reading files"
            } else {
                "on CPU"
            };
            let functions = s.functions_said();
            format!(
                "{} {:.1}% — {} {}{}",
                s.stage,
                s.pct,
                units::duration(s.ns),
                what,
                if functions.is_empty() {
                    String::new()
                } else {
                    format!(": {}", functions.join(" · "))
                }
            )
        })
        .collect();
    b.push(Block::Bullets(lines));
}

/// The GPU over the run's steps, as a step breakdown reads: busy and each
/// cause's share of the steps' time.
/// "requests: 80 at 21.3/s · each 4.3ms p50, 4.9ms p99 …".
fn requests_line(q: &super::gpu_report::RequestsReport) -> String {
    let mut line = format!(
        "requests: {} at {:.1}/s · each {} p50, {} p99 (from its arrival to the server waiting for the next) · GPU busy {} a request",
        units::count(q.count),
        q.rate_per_s,
        units::duration(q.latency_p50_ns),
        units::duration(q.latency_p99_ns),
        units::duration(q.gpu_busy_per_request_ns),
    );
    if let Some(j) = q.energy_per_request_j {
        line.push_str(&format!(" · {j:.2} J a request"));
    }
    line
}

fn steps_line(st: &super::report::StepsReport, i: &super::gpu_report::InSteps) -> String {
    let mut parts = vec![format!("busy {}", units::percent(i.busy_ns, i.span_ns))];
    parts.extend(
        i.idle_by_cause_ns
            .entries()
            .filter(|(_, ns)| *ns > 0)
            .map(|(c, ns)| format!("{} {}", c.name(), units::percent(ns, i.span_ns))),
    );
    format!(
        "over {} steps ({}, mean {}{}): {}",
        st.count,
        st.source,
        units::duration(st.mean_ns),
        if st.cut > 0 {
            format!(
                "; the last {} left out, their GPU work not in the trace",
                st.cut
            )
        } else {
            String::new()
        },
        parts.join(" · ")
    )
}

fn gpu_blocks(r: &Report, b: &mut Vec<Block>) {
    for s in r
        .gpu_sources
        .iter()
        .filter(|s| s.kind == SourceKind::Uprobe)
    {
        b.push(Block::Line(format!(
            "GPU timeline of pid {}: approximate (no kernel times) — CUDA driver calls seen by \
             libcuda uprobes only; run it under `gapscope run` for the CUPTI timeline",
            s.pid
        )));
    }
    if r.gpus.is_empty() {
        b.push(Block::Line(if r.gpu_sources.is_empty() {
            "GPUs: no GPU activity recorded (no CUDA process in the tree, or --no-gpu)".into()
        } else {
            "GPUs: no GPU activity recorded (CUDA was loaded but no kernel or copy ran)".into()
        }));
        return;
    }
    b.push(Block::Heading("GPUs: allocated vs utilized vs busy".into()));
    for g in &r.gpus {
        let util = g
            .nvml_util_pct
            .map(|u| format!("{u:.0}%"))
            .unwrap_or_else(|| "n/a".into());
        b.push(Block::Line(format!(
            "GPU {} {} ({}): allocated {} · NVML utilization {} · busy {} ({}) · idle {}",
            g.id,
            g.name,
            g.source.name(),
            units::duration(g.allocated_ns),
            util,
            units::duration(g.busy_ns),
            units::percent(g.busy_ns, g.allocated_ns),
            units::duration(g.idle_ns),
        )));
        if g.unseen_ns > 0 {
            b.push(Block::Line(format!(
                "  not seen {} ({}): neither busy nor idle (see 'GPU not seen' above)",
                units::duration(g.unseen_ns),
                units::percent(g.unseen_ns, g.allocated_ns)
            )));
        }
        let gap = |x: &super::gpu_report::GapReport| {
            format!(
                "{} ({})",
                units::count(x.count),
                units::duration(x.total_ns)
            )
        };
        let mut lines = vec![format!(
            "span {} · gaps >10µs: {} · >100µs: {} · >1ms: {}",
            units::duration(g.span_ns),
            gap(&g.gaps.gt_10us),
            gap(&g.gaps.gt_100us),
            gap(&g.gaps.gt_1ms)
        )];
        let k = &g.busy_by_kind_ns;
        // Said only when something other than compute kept the GPU busy.
        if k.communication + k.memory > 0 {
            let mut parts = vec![format!("compute {}", units::duration(k.compute))];
            if k.communication > 0 {
                parts.push(if k.communication_waiting > 0 {
                    format!(
                        "communication alone {} (NCCL; {} of it waiting for the other GPUs to reach the collective)",
                        units::duration(k.communication),
                        units::duration(k.communication_waiting)
                    )
                } else {
                    format!(
                        "communication alone {} (NCCL, waits on other ranks included)",
                        units::duration(k.communication)
                    )
                });
            }
            if k.memory > 0 {
                parts.push(format!(
                    "copies/memsets alone {}",
                    units::duration(k.memory)
                ));
            }
            lines.push(format!("busy: {}", parts.join(" · ")));
        }
        let causes: Vec<String> = g
            .idle_by_cause_ns
            .entries()
            .filter(|(_, ns)| *ns > 0)
            .map(|(c, ns)| format!("{} {}", c.name(), units::duration(ns)))
            .collect();
        lines.push(format!("idle: {}", causes.join(" · ")));
        if let (Some(st), Some(i)) = (&r.steps, &g.in_steps) {
            lines.push(steps_line(st, i));
        }
        if let Some(q) = &g.requests {
            lines.push(requests_line(q));
        }
        let mut ran = vec![format!(
            "kernels {} ({})",
            units::count(g.kernels.count),
            units::duration(g.kernels.total_ns)
        )];
        for (kind, c) in &g.copies {
            ran.push(format!(
                "{kind} {} × {} ({})",
                units::count(c.count),
                units::bytes(c.bytes),
                units::duration(c.total_ns)
            ));
        }
        if g.memsets.count > 0 {
            ran.push(format!(
                "memset {} ({})",
                units::count(g.memsets.count),
                units::duration(g.memsets.total_ns)
            ));
        }
        lines.push(ran.join(" · "));
        if let Some(e) = g.energy_j {
            lines.push(format!("energy {e:.1} J"));
        }
        b.push(Block::Bullets(lines));
    }
    let api: Vec<String> = r
        .cuda_api
        .iter()
        .take(MAX_DETAIL_THREADS)
        .map(|t| {
            let calls: Vec<String> = t
                .calls
                .iter()
                .take(4)
                .map(|c| {
                    format!(
                        "{} ×{} {}",
                        c.name,
                        units::count(c.count),
                        units::duration(c.total_ns)
                    )
                })
                .collect();
            format!("{}/{}: {}", t.pid, t.tid, calls.join(" · "))
        })
        .collect();
    if !api.is_empty() {
        b.push(Block::Heading("CUDA API time per thread".into()));
        b.push(Block::Bullets(api));
    }
}

fn who(t: &ThreadReport) -> String {
    format!("{}/{} {}", t.pid, t.tid, t.comm)
}

fn drops_line(r: &Report) -> String {
    let inferred = match r.drops.inferred_switches {
        0 => String::new(),
        n => format!(" ({n} context switches the kernel did not report were inferred)"),
    };
    let own = match (
        r.session.collector_cpu_ns,
        r.session.collector_peak_rss_bytes,
    ) {
        (Some(cpu), Some(rss)) => format!(
            " · gapscope itself: {} CPU ({} of the run), {} peak memory",
            units::duration(cpu),
            units::percent(cpu, r.session.duration_ns),
            units::bytes(rss)
        ),
        _ => String::new(),
    };
    if r.drops.cpu_events == 0 && r.drops.gpu_records == 0 {
        return format!("drops: none{inferred}{own}");
    }
    let by_kind: Vec<String> = r
        .drops
        .cpu_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!(
        "drops: {} CPU events ({}), {} GPU records — times around them are less certain; \
         a larger --buffer-mb or a lower --freq helps{inferred}{own}",
        r.drops.cpu_events,
        by_kind.join(", "),
        r.drops.gpu_records
    )
}

fn thread_table(r: &Report) -> Table {
    let mut header = vec!["PID", "TID", "COMM", "LIFETIME", "ON-CPU", "RUNQ"];
    // Only where a CPU was taken from a thread (a VM's steal): a column
    // of zeros everywhere else.
    let stolen = r.threads.iter().any(|t| t.stolen_ns > 0);
    if stolen {
        header.push("STOLEN");
    }
    header.extend(OffKind::ALL.iter().map(|k| match k {
        OffKind::File => "FILE",
        OffKind::Net => "NET",
        OffKind::Ipc => "IPC",
        OffKind::Sleep => "SLEEP",
        OffKind::Gpu => "GPU",
        OffKind::Fault => "FAULT",
        OffKind::Other => "OTHER",
    }));
    let mut right = vec![true; header.len()];
    right[2] = false;
    let mut threads: Vec<&ThreadReport> = r.threads.iter().collect();
    let hidden = threads.len().saturating_sub(MAX_THREAD_ROWS);
    if hidden > 0 {
        threads.sort_by_key(|t| std::cmp::Reverse(t.on_cpu_ns + t.off_cpu_ns.total()));
        threads.truncate(MAX_THREAD_ROWS);
        threads.sort_by_key(|t| (t.pid, t.tid));
    }
    let rows: Vec<Vec<String>> = threads
        .iter()
        .map(|t| {
            let life = t.lifetime_ns;
            let mut row = vec![
                t.pid.to_string(),
                t.tid.to_string(),
                t.comm.clone(),
                units::duration(life),
                units::percent(t.on_cpu_ns, life),
                units::percent(t.runnable_ns, life),
            ];
            if stolen {
                row.push(units::percent(t.stolen_ns, life));
            }
            row.extend(
                OffKind::ALL
                    .iter()
                    .map(|&k| units::percent(t.off_cpu_ns.get(k), life)),
            );
            row
        })
        .collect();
    Table {
        header,
        right,
        rows,
        note: (hidden > 0).then(|| {
            format!("… and {hidden} shorter-lived or idle threads (all are in --format json)")
        }),
    }
}

/// Threads whose samples were in named regions of the job's code, most
/// sampled first: each region's share of the thread's samples.
fn code_lines(r: &Report) -> Vec<String> {
    let mut threads: Vec<&ThreadReport> = r.threads.iter().filter(|t| !t.code.is_empty()).collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.samples));
    threads
        .into_iter()
        .take(MAX_DETAIL_THREADS)
        .map(|t| {
            let named: u64 = t.code.iter().map(|c| c.samples).sum();
            let mut parts: Vec<String> = t
                .code
                .iter()
                .map(|c| {
                    format!(
                        "{} {}",
                        c.region.name(),
                        units::percent(c.samples, t.samples)
                    )
                })
                .collect();
            if t.samples > named {
                parts.push(format!(
                    "other {}",
                    units::percent(t.samples - named, t.samples)
                ));
            }
            format!("{}: {}", who(t), parts.join(" · "))
        })
        .collect()
}

fn top_stacks(r: &Report, pick: impl Fn(&ThreadReport) -> &Vec<StackReport>) -> Vec<String> {
    stack_lines(
        r.threads
            .iter()
            .flat_map(|t| pick(t).iter().map(move |s| (who(t), s))),
    )
}

/// The six heaviest stacks as lines, each `(thread, stack)`. Stacks that
/// read the same here (deeper kernel frames and frames cut after
/// MAX_FRAMES differ; the JSON keeps them apart) are one line.
fn stack_lines<'a>(stacks: impl Iterator<Item = (String, &'a StackReport)>) -> Vec<String> {
    let mut lines: Vec<((String, String, String), u64)> = Vec::new();
    for (who, s) in stacks {
        let (kind, chain) = stack_text(s);
        let key = (who, kind, chain);
        match lines.iter_mut().find(|(k, _)| *k == key) {
            Some((_, w)) => *w += s.weight_ns,
            None => lines.push((key, s.weight_ns)),
        }
    }
    lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    lines
        .into_iter()
        .take(6)
        .map(|((who, kind, chain), weight)| {
            format!("{who} {kind}{}: {chain}", units::duration(weight))
        })
        .collect()
}

/// How one stack reads in the text report: its kind (off-CPU), and its
/// useful frames with the kernel frame that says what it did.
fn stack_text(s: &StackReport) -> (String, String) {
    let useful = readable_frames(s.frames.iter().map(String::as_str));
    let mut frames: Vec<String> = useful
        .iter()
        .take(MAX_FRAMES)
        .map(|f| short_frame(f))
        .collect();
    if useful.len() > MAX_FRAMES {
        frames.push("…".into());
    }
    let chain = if frames.is_empty() {
        "[no user stack]".to_string()
    } else {
        frames.join(" ← ")
    };
    let kind = s.kind.map(|k| format!("{} ", k.name())).unwrap_or_default();
    let kernel = kernel_note(s.kernel_frames.iter().rev().map(String::as_str));
    (kind, format!("{chain}{kernel}"))
}

/// User frames (innermost first) worth reading: without the runtime's
/// entry frames (only those, when that is all there is: inlined code), a
/// name repeated by recursion or inlined wrappers once.
pub(crate) fn readable_frames<'a>(frames: impl Iterator<Item = &'a str> + Clone) -> Vec<&'a str> {
    let mut useful: Vec<&str> = frames
        .clone()
        .filter(|f| !crate::session::is_entry_frame(f))
        .collect();
    if useful.is_empty() {
        useful = frames.collect();
    }
    useful.dedup();
    useful
}

/// What a kernel stack (root first) did, as the text shows it after the
/// user frames: `  [kernel: NAME]`, NAME the first frame past the syscall
/// entry; empty without one.
pub(crate) fn kernel_note<'a>(root_first: impl IntoIterator<Item = &'a str>) -> String {
    root_first
        .into_iter()
        .find(|f| {
            !f.starts_with("entry_")
                && !f.starts_with("do_syscall")
                && !f.starts_with("x64_sys_call")
        })
        .map(|f| format!("  [kernel: {f}]"))
        .unwrap_or_default()
}

/// A frame name cut to a readable length (C++/Rust generics run long).
fn short_frame(f: &str) -> String {
    const MAX: usize = 60;
    if f.chars().count() <= MAX {
        f.to_string()
    } else {
        let cut: String = f.chars().take(MAX - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_that_read_the_same_are_one_line() {
        let stack = |weight_ns, kernel: &[&str]| StackReport {
            weight_ns,
            samples: None,
            kind: None,
            frames: vec!["__libc_pread64".into(), "load".into(), "main".into()],
            kernel_frames: kernel.iter().map(|f| f.to_string()).collect(),
        };
        // Two paths through the kernel below the same syscall, one other.
        let a = stack(
            30,
            &["blk_finish_plug", "__x64_sys_pread64", "do_syscall_64"],
        );
        let b = stack(20, &["iomap_dio_rw", "__x64_sys_pread64", "do_syscall_64"]);
        let c = stack(40, &["vfs_read", "ksys_read", "do_syscall_64"]);
        let lines = stack_lines(
            [("1/1 t", &a), ("1/1 t", &c), ("1/1 t", &b), ("1/2 u", &a)]
                .into_iter()
                .map(|(w, s)| (w.to_string(), s)),
        );
        let pread = "__libc_pread64 ← load ← main  [kernel: __x64_sys_pread64]";
        assert_eq!(
            lines,
            [
                format!("1/1 t 50ns: {pread}"),
                "1/1 t 40ns: __libc_pread64 ← load ← main  [kernel: ksys_read]".to_string(),
                format!("1/2 u 30ns: {pread}"),
            ]
        );
    }

    #[test]
    fn entry_frames_are_recognised() {
        use crate::session::is_entry_frame;
        assert!(is_entry_frame("__libc_start_call_main"));
        assert!(is_entry_frame("std::rt::lang_start_internal"));
        assert!(!is_entry_frame("main"));
        assert!(!is_entry_frame("load_batch"));
    }
}
