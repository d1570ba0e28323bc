//! Any bytes from the shim's socket, in any split: the decoder yields
//! frames, asks for more, or returns an error — never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gapscope::fuzzing::wire_protocol(data);
});
