//! Fuzz compaction's record rules: the offset map and the batch filter over stored batches.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_compaction(data);
});
