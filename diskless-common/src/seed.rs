//! The one place library code takes randomness from outside.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A seed from the operating system's entropy, for a component whose seed was not injected.
///
/// Library code never draws unseeded random numbers: every component that needs randomness (object
/// key suffixes, retry jitter, shard-map nonces) takes a seed, from its builder when the host or a
/// test injects one, from this function otherwise. `.config/clippy.toml` forbids the unseeded
/// constructors elsewhere, so a replayed simulation seed replays every random choice.
///
/// ```
/// let a = diskless_common::entropy_seed();
/// let b = diskless_common::entropy_seed();
/// assert_ne!(a, b, "two calls give two seeds (with overwhelming probability)");
/// ```
pub fn entropy_seed() -> u64 {
    // `RandomState` is seeded from the OS once per thread and advanced on every construction.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x9E37_79B9_7F4A_7C15);
    hasher.finish()
}
