//! gapscope-wire: what the CUPTI shim (and the examples' simulated device)
//! and the profiler say to each other — the framed protocol, the GPU
//! records it carries, the clock both sides time them on, the Unix-socket
//! transport with its control socket, and the CUDA callback ids' names.
//!
//! Both sides link this crate; the shim itself (`cupti-shim/`) is a cdylib
//! only, loaded by the CUDA driver into the target.

pub mod cbid;
mod cbid_names;
pub mod clock;
pub mod protocol;
pub mod record;
pub mod transport;

pub use protocol::{ClockMethod, Decoder, Frame, Hello};
pub use record::{ApiDomain, GpuRecord};

/// File name of the injectable library (cupti-shim/) as cargo builds it.
pub const LIBRARY_NAME: &str = "libgapscope_cupti.so";
