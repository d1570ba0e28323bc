//! gapscope-cupti: the library the CUDA driver loads into a GPU process
//! (through `CUDA_INJECTION64_PATH`) to stream what the GPU did to gapscope,
//! in the protocol of `gapscope-wire` (wire/). A cdylib only: dormant in the
//! target until a profiler listens.

mod activity;
mod inject;
mod loader;
mod nvtx;

// The wire's modules under the names this crate's code has always used.
use gapscope_wire::{clock, protocol, record, transport};
