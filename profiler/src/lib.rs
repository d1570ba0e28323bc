//! gapscope: measures whether GPUs did useful work and, when they sat idle,
//! names the cause. This crate is the library behind the `gapscope` binary:
//! `collect` records a process tree with eBPF into a `session`, `timeline`
//! replays it into per-thread accounts, and `export` renders reports.

pub mod analyze;
pub mod clock;
pub mod collect;
pub mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod inputs;
pub mod kineto;
pub mod output;
pub mod session;
pub mod timeline;
