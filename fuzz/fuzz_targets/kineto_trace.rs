//! Any bytes as a PyTorch profiler trace: an import error or a session
//! whose report builds — never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gapscope::fuzzing::kineto_trace(data);
});
