//! CUDA API time per host thread, by function, and the host's
//! synchronization waits by kind. Field names are part of the
//! `gapscope.report/1` contract.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::timeline::totals::GpuTotals;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ApiCall {
    pub name: String,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// CUDA API time of one host thread.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ApiThread {
    pub pid: u32,
    /// The thread id as the GPU source reported it.
    pub tid: u32,
    pub calls: Vec<ApiCall>,
}

/// Host-side synchronization waits, by kind.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SyncReport {
    pub kind: String,
    pub count: u64,
    pub total_ns: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ApiAccounting {
    /// Threads in (pid, tid) order; each one's calls by total time.
    pub threads: Vec<ApiThread>,
    pub syncs: Vec<SyncReport>,
}

pub fn accounting(totals: &GpuTotals) -> ApiAccounting {
    let mut threads = Vec::new();
    for (&(pid, tid), t) in &totals.threads {
        // Counted by id, then named once per id: millions of calls share a
        // handful of names.
        let mut by_name: BTreeMap<String, ApiCall> = BTreeMap::new();
        for (name, &(count, total_ns, max_ns)) in &t.by_name {
            let name = name.name().into_owned();
            let c = by_name.entry(name.clone()).or_insert(ApiCall {
                name,
                count: 0,
                total_ns: 0,
                max_ns: 0,
            });
            c.count += count;
            c.total_ns += total_ns;
            c.max_ns = c.max_ns.max(max_ns);
        }
        let mut calls: Vec<ApiCall> = by_name.into_values().collect();
        calls.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
        threads.push(ApiThread { pid, tid, calls });
    }
    let by_type = &totals.syncs;
    let mut syncs: BTreeMap<String, SyncReport> = BTreeMap::new();
    for (&sync_type, &(count, total_ns)) in by_type {
        let kind = gapscope_wire::record::sync_type::name(sync_type).to_string();
        let sr = syncs.entry(kind.clone()).or_insert(SyncReport {
            kind,
            count: 0,
            total_ns: 0,
        });
        sr.count += count;
        sr.total_ns += total_ns;
    }
    ApiAccounting {
        threads,
        syncs: syncs.into_values().collect(),
    }
}
