//! Per GPU: its busy timeline and the attribution of every idle nanosecond,
//! with the recording's lossy windows and blind spans applied.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::account::Account;
use super::attribute::{self, Attribution, Cause, Inputs, Piece, Tid};
use super::code::CodeOf;
use super::gpu::{gpu_timelines, GpuTimeline};
use crate::session::Session;
use crate::timeline::{State, ThreadTimeline, Timeline};

pub struct GpuDiagnosis {
    pub gpu: GpuTimeline,
    pub attribution: Attribution,
    /// The thread that issued most of this GPU's work, and its whole time
    /// by the attribution's rules: what the what-if replay rearranges.
    pub feeder: Option<Feeder>,
}

pub struct Feeder {
    pub tid: Tid,
    /// Its account in time order, as [`Feeder::extend`] keeps it.
    pub account: Account,
    /// Every thread its waits led to (the loaders it waited on).
    pub waited: HashSet<Tid>,
    /// The thread last added to `waited`.
    last_waited: Option<Tid>,
    /// The wait for other threads still being added to.
    wait: Option<Wait>,
    /// Its on-CPU time per [`CPU_BUCKET_NS`] from `start`: the replay asks
    /// how much CPU it took while its loaders worked.
    cpu: Vec<u64>,
    start: u64,
}

/// A wait of the feeder for other threads, past its first piece: its time
/// by cause, in the order the causes came, and the thread that first
/// decided each.
struct Wait {
    end: u64,
    parts: Vec<(Cause, u64, Option<Tid>)>,
}

pub const CPU_BUCKET_NS: u64 = 10_000_000;

impl Feeder {
    pub fn new(tid: Tid, window_start: u64) -> Feeder {
        Feeder {
            tid,
            account: Account::default(),
            waited: HashSet::new(),
            last_waited: None,
            wait: None,
            cpu: Vec::new(),
            start: window_start,
        }
    }

    /// Adds the next pieces of its account (in time order). A wait for
    /// other threads is kept as its first piece and then its time by cause
    /// laid end to end up to the wait's end: the replay reads no more of a
    /// wait than that (where it began and ended, and how much of it each
    /// cause took), and a long run's waits are millions of pieces, one per
    /// state its loaders passed through. Call [`Feeder::close`] after the
    /// last.
    pub fn extend(&mut self, pieces: impl IntoIterator<Item = Piece>) {
        for p in pieces {
            let other = p.thread.filter(|&t| t != self.tid);
            let Some(t) = other else {
                self.close();
                self.account.push(&p, self.tid);
                continue;
            };
            // (Pieces of one wait come in runs of one thread: the set is
            // asked only when the thread changes.)
            if self.last_waited != Some(t) {
                self.waited.insert(t);
                self.last_waited = Some(t);
            }
            let Some(w) = self.wait.as_mut() else {
                self.account.push(&p, self.tid);
                self.wait = Some(Wait {
                    end: p.end,
                    parts: Vec::new(),
                });
                continue;
            };
            w.end = p.end;
            let ns = p.end - p.start;
            match w.parts.iter_mut().find(|x| x.0 == p.cause) {
                Some(x) => x.1 += ns,
                None => w.parts.push((p.cause, ns, p.thread)),
            }
        }
    }

    /// Ends the wait being added to, if any.
    pub fn close(&mut self) {
        let Some(w) = self.wait.take() else { return };
        let total: u64 = w.parts.iter().map(|x| x.1).sum();
        let mut at = w.end - total;
        for (cause, ns, thread) in w.parts {
            let p = Piece {
                start: at,
                end: at + ns,
                cause,
                thread,
            };
            self.account.push(&p, self.tid);
            at += ns;
        }
    }

    /// Adds its on-CPU time in `[a, b)` (its states there still kept).
    pub fn add_cpu(&mut self, threads: &BTreeMap<Tid, ThreadTimeline>, a: u64, b: u64) {
        let Some(iv) = threads.get(&self.tid).and_then(|t| t.intervals.as_deref()) else {
            return;
        };
        let i = iv.partition_point(|x| x.end <= a);
        for x in iv[i..].iter().take_while(|x| x.start < b) {
            if x.state != State::OnCpu {
                continue;
            }
            let (mut s, e) = (x.start.max(a), x.end.min(b));
            while s < e {
                let k = ((s - self.start) / CPU_BUCKET_NS) as usize;
                let bucket_end = self.start + (k as u64 + 1) * CPU_BUCKET_NS;
                let upto = e.min(bucket_end);
                if self.cpu.len() <= k {
                    self.cpu.resize(k + 1, 0);
                }
                self.cpu[k] += upto - s;
                s = upto;
            }
        }
    }

    /// Its on-CPU time in `[a, b)`, to a bucket.
    pub fn cpu_within(&self, a: u64, b: u64) -> u64 {
        let k = |t: u64| (t.saturating_sub(self.start) / CPU_BUCKET_NS) as usize;
        let (from, to) = (
            k(a),
            k(b.saturating_sub(1)).min(self.cpu.len().saturating_sub(1)),
        );
        self.cpu.get(from..=to).map_or(0, |x| x.iter().sum())
    }
}

pub struct Diagnosis {
    pub gpus: Vec<GpuDiagnosis>,
    /// Where CPU events or GPU records were lost: idle inside is charged to
    /// unattributed.
    pub lossy_windows: Vec<(u64, u64)>,
    /// The run's steps, where marked: the attribution also tallies the idle
    /// inside them.
    pub steps: Option<super::steps::Summary>,
}

/// What each thread's profiler ops (imported traces) say, read with the
/// code rules as live frames are, as disjoint sorted (start, end, cause)
/// segments.
pub(crate) fn op_causes(tl: &Timeline, code: &CodeOf) -> HashMap<Tid, Vec<(u64, u64, Cause)>> {
    tl.gpu
        .host_ops
        .iter()
        .map(|(t, ops)| {
            let causes = ops
                .iter()
                .map(|o| {
                    (
                        o.start,
                        o.end,
                        attribute::op_cause(&o.name, code.op(&o.name)),
                    )
                })
                .collect();
            (*t, attribute::flatten_ops(causes))
        })
        .collect()
}

/// `tl` must have been built with intervals. `keep_pieces`: see
/// [`Inputs::keep_pieces`].
pub fn diagnose(session: &Session, tl: &Timeline, keep_pieces: bool, code: &CodeOf) -> Diagnosis {
    let ops = op_causes(tl, code);
    let steps = super::steps::summary(tl);
    let lossy_windows = super::loss::lossy_windows(session);
    let blind_windows = super::loss::blind_windows(session);
    let edges = attribute::Edges::of(session);
    let gpus = gpu_timelines(&tl.gpu, tl.start, tl.end)
        .into_iter()
        .zip(&tl.gpu.devices)
        .map(|(gpu, device)| {
            let spans = edges.bound((tl.start, tl.end), &gpu.busy);
            let inputs = Inputs {
                window: (tl.start, tl.end),
                busy: &spans,
                work: &device.work,
                threads: &tl.threads,
                processes: &tl.processes,
                io_tally: &tl.io_tally,
                api: &tl.gpu.calls,
                ops: &ops,
                code: Some(code),
                blind: &blind_windows,
                lossy: &lossy_windows,
                keep_pieces,
                steps: steps.as_ref().map(super::steps::Summary::span),
                unsettled: None,
            };
            let attribution = attribute::attribute(&inputs);
            let feeder = attribute::main_feeder(&device.work).map(|tid| {
                let mut account = Attribution::pieces_only();
                attribute::account(&inputs, tid, tl.start, tl.end, &mut account);
                let mut f = Feeder::new(tid, tl.start);
                f.extend(account.pieces);
                f.close();
                f.add_cpu(&tl.threads, tl.start, tl.end);
                f
            });
            GpuDiagnosis {
                gpu,
                attribution,
                feeder,
            }
        })
        .collect();
    Diagnosis {
        gpus,
        lossy_windows,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::account::Who;

    fn p(start: u64, end: u64, cause: Cause, thread: Tid) -> Piece {
        Piece {
            start,
            end,
            cause,
            thread: Some(thread),
        }
    }

    /// A wait for the loaders keeps its first piece, then its time by
    /// cause up to its end: where it began and ended and what each cause
    /// took, as the replay reads it; the loaders it led to are kept apart.
    #[test]
    fn a_wait_for_the_loaders_is_kept_by_cause() {
        let (me, a, b) = ((1, 1), (2, 2), (3, 3));
        let mut f = Feeder::new(me, 0);
        f.extend([
            p(0, 10, Cause::CpuHost, me),
            p(10, 12, Cause::InputIo, a),
            p(12, 15, Cause::InputCpu, a),
            p(15, 20, Cause::InputIo, b),
        ]);
        // A wait continues across calls.
        f.extend([
            p(20, 21, Cause::InputCpu, b),
            p(21, 30, Cause::CpuLaunch, me),
        ]);
        f.extend([p(30, 35, Cause::InputIo, a)]);
        f.close();
        let got: Vec<(u64, u64, Cause, Who)> = f
            .account
            .iter()
            .map(|m| (m.start, m.end, m.cause, m.who))
            .collect();
        assert_eq!(
            got,
            [
                (0, 10, Cause::CpuHost, Who::Feeder),
                (10, 12, Cause::InputIo, Who::Other),
                (12, 16, Cause::InputCpu, Who::Other),
                (16, 21, Cause::InputIo, Who::Other),
                (21, 30, Cause::CpuLaunch, Who::Feeder),
                (30, 35, Cause::InputIo, Who::Other),
            ]
        );
        assert_eq!(f.waited, HashSet::from([a, b]));
    }
}
