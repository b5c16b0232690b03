//! Fuzz the tiered segment parsers and lookups: the first 16 bytes are a target offset and a target
//! timestamp (i64 LE each), the rest is a tiered segment object (and, on its own, every section).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_tiered_segment_reader(data);
});
