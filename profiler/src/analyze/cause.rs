//! The causes of GPU idle time, defined once: each one's name (the JSON key
//! and the word every report and picture uses), its colour, and whether
//! fixing the job can remove it. Everything else derives from this table;
//! a new cause is a new row here (and the compiler then points at the rule
//! and the advice it needs, which match on the enum).

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    InputIo,
    InputCpu,
    InputNetwork,
    /// Waiting for input, kind unknown: traces without off-CPU data.
    InputUnknown,
    CpuHost,
    CpuLaunch,
    CpuContention,
    Sync,
    /// Waiting for other ranks: inside a collective or point-to-point call
    /// (torch.distributed, gloo, NCCL's host side, MPI).
    Comm,
    Memory,
    /// Waiting for requests: a server's feeder blocked for the next request
    /// (no work was offered). The load, not a stall: no fix in the job
    /// removes it.
    Demand,
    Startup,
    Teardown,
    Unattributed,
}

/// One row of the vocabulary.
struct Def {
    name: &'static str,
    /// Stable across reports, so that people learn them.
    color: &'static str,
    /// Idle that fixing something in the job could remove (start-up and
    /// tear-down every run pays; unattributed is not known to be either).
    removable: bool,
}

/// In contract order (the order of `idle_by_cause_ns`), indexed by the
/// enum's discriminant.
const DEFS: [Def; 14] = [
    Def {
        name: "input.io",
        color: "#d62728",
        removable: true,
    },
    Def {
        name: "input.cpu",
        color: "#ff7f0e",
        removable: true,
    },
    Def {
        name: "input.network",
        color: "#9467bd",
        removable: true,
    },
    Def {
        name: "input.unknown",
        color: "#e7969c",
        removable: true,
    },
    Def {
        name: "cpu.host",
        color: "#8c564b",
        removable: true,
    },
    Def {
        name: "cpu.launch",
        color: "#e377c2",
        removable: true,
    },
    Def {
        name: "cpu.contention",
        color: "#bcbd22",
        removable: true,
    },
    Def {
        name: "sync",
        color: "#1f77b4",
        removable: true,
    },
    Def {
        name: "comm",
        color: "#2ca02c",
        removable: true,
    },
    Def {
        name: "memory",
        color: "#17becf",
        removable: true,
    },
    Def {
        name: "demand",
        color: "#dbdb8d",
        removable: false,
    },
    Def {
        name: "startup",
        color: "#c7c7c7",
        removable: false,
    },
    Def {
        name: "teardown",
        color: "#a5a5a5",
        removable: false,
    },
    Def {
        name: "unattributed",
        color: "#7f7f7f",
        removable: false,
    },
];

impl Cause {
    pub const ALL: [Cause; 14] = [
        Cause::InputIo,
        Cause::InputCpu,
        Cause::InputNetwork,
        Cause::InputUnknown,
        Cause::CpuHost,
        Cause::CpuLaunch,
        Cause::CpuContention,
        Cause::Sync,
        Cause::Comm,
        Cause::Memory,
        Cause::Demand,
        Cause::Startup,
        Cause::Teardown,
        Cause::Unattributed,
    ];

    fn def(self) -> &'static Def {
        &DEFS[self as usize]
    }

    /// The cause's name: the JSON key and the word reports use.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    pub fn color(self) -> &'static str {
        self.def().color
    }

    /// Idle that fixing something in the job could remove.
    pub fn removable(self) -> bool {
        self.def().removable
    }
}

/// A cause is written as its name.
impl Serialize for Cause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Idle time per cause, every nanosecond of idle in exactly one entry.
/// Serialised as an object keyed by cause name, in contract order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct IdleByCause([u64; Cause::ALL.len()]);

impl IdleByCause {
    pub fn from_fn(mut ns: impl FnMut(Cause) -> u64) -> IdleByCause {
        IdleByCause(Cause::ALL.map(&mut ns))
    }

    pub fn get(&self, c: Cause) -> u64 {
        self.0[c as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// (cause, ns) pairs in contract order.
    pub fn entries(&self) -> impl Iterator<Item = (Cause, u64)> + '_ {
        Cause::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

impl Serialize for IdleByCause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(Cause::ALL.len()))?;
        for (c, ns) in self.entries() {
            m.serialize_entry(c.name(), &ns)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_the_enums_order_and_names_are_unique() {
        for (i, c) in Cause::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
        let mut names: Vec<&str> = Cause::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Cause::ALL.len());
    }

    #[test]
    fn idle_by_cause_serialises_as_the_contracts_object() {
        let idle = IdleByCause::from_fn(|c| c as u64 * 10);
        let v = serde_json::to_value(&idle).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 14);
        assert_eq!(v["input.io"], 0);
        assert_eq!(v["unattributed"], 130);
        assert_eq!(idle.total(), (0..14).map(|i| i * 10).sum::<u64>());
    }
}
