//! Fuzz the Fetcher's reads of tiered segment objects: a header (`TieredFetchInput`: coordinator
//! rows with their layouts, fetch offsets and limits, a ListOffsets timestamp) then the segment
//! objects' bytes. Runs `Fetcher::fetch` and `Fetcher::list_offsets` over them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = diskless_core::fuzzing::fuzz_tiered_fetch(data);
});
