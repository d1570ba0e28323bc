//! Any bytes as a session file: reading must end in a session (perhaps
//! marked truncated) or an error, and the report of whatever was read must
//! build — never a panic, never an allocation of a length the file claims.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gapscope::fuzzing::session_file(data);
});
