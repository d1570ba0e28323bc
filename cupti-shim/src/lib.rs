//! gapscope-cupti: the library the CUDA driver loads into a GPU process
//! (through `CUDA_INJECTION64_PATH`) to stream what the GPU did to gapscope,
//! and the wire protocol both sides speak.
//!
//! The rlib half (`protocol`, `record`, `activity`) is what the profiler and
//! the examples' simulated device link; the cdylib half (`inject`) is what
//! runs inside the target, dormant until a profiler listens.

pub mod activity;
pub mod cbid;
mod cbid_names;
pub mod clock;
mod inject;
mod loader;
mod nvtx;
pub mod protocol;
pub mod record;
pub mod transport;

pub use protocol::{ClockMethod, Decoder, Frame, Hello};
pub use record::{ApiDomain, GpuRecord};

/// File name of the injectable library as cargo builds it.
pub const LIBRARY_NAME: &str = "libgapscope_cupti.so";
