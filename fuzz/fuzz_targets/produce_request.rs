//! Fuzz the Produce request reader (`diskless_core::produce_request`): never a panic; an accepted
//! request's records lie inside the input and its answer encodes with a consistent size.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_produce_request(data);
});
