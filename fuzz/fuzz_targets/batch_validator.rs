//! Fuzz the produce-path parser and validator: `split_batches`, `validate_batch`, and the fetch-path
//! rewrites of every batch that validates.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_batch_validator(data);
});
