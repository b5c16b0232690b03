//! Fuzz the transaction marker parser: any accepted input rebuilds to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    diskless_core::fuzzing::fuzz_txn_marker(data);
});
