//! Fuzz the WAL segment reader: the first 12 bytes are coordinates (u64 LE byte offset, u32 LE size),
//! the rest is the segment object.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_segment_reader(data);
});
