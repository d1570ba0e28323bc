//! Any bytes as the records inside one valid chunk: past the checksums,
//! into record decoding, and through the analysis of whatever decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gapscope::fuzzing::session_records(data);
});
