//! Analysis over the merged timeline: GPU busy/idle and gaps, CUDA API
//! accounting.

pub mod attribute;
pub mod cause;
pub mod checks;
pub mod diagnose;
pub mod gpu;
pub mod intervals;
pub mod loss;
pub mod nvml;
pub mod recommend;

pub use gapscope_cupti::cbid::{api_name, cbid_of};

/// A map looked up once per GPU record, millions of times: a fast hasher,
/// still seeded at random so that a crafted file cannot make it quadratic.
pub type RecordMap<K, V> = ahash::AHashMap<K, V>;
