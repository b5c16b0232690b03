//! The trace of a run: a running 64-bit hash of every event, and the last events as text.

use std::collections::VecDeque;
use std::fmt::Write as _;

/// FNV-1a offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a prime.
const FNV_PRIME: u64 = 0x100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `hash`. Stable across platforms and Rust versions.
pub fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// A running hash of events, each a line of text (`"<virtual ms> <event>"`), with the last
/// `tail` lines kept for a failure report and, when `echo` is set, every line printed to stderr
/// (a replay).
#[derive(Debug)]
pub(crate) struct Trace {
    hash: u64,
    events: u64,
    tail: VecDeque<String>,
    cap: usize,
    echo: bool,
    line: String,
}

impl Trace {
    pub(crate) fn new(cap: usize, echo: bool) -> Self {
        Trace {
            hash: FNV_OFFSET,
            events: 0,
            tail: VecDeque::with_capacity(cap.min(4096)),
            cap,
            echo,
            line: String::new(),
        }
    }

    /// Records one event at virtual time `at_ms`.
    pub(crate) fn event(&mut self, at_ms: i64, what: std::fmt::Arguments<'_>) {
        self.line.clear();
        let _ = write!(self.line, "{at_ms:>9} {what}");
        self.hash = fnv1a(self.line.as_bytes(), self.hash);
        self.hash = fnv1a(b"\n", self.hash);
        self.events += 1;
        if self.echo {
            // `SimConfig::echo`: the caller asked for the trace on stderr, as it happens.
            #[allow(clippy::print_stderr)]
            {
                eprintln!("{}", self.line);
            }
        }
        if self.cap > 0 {
            if self.tail.len() == self.cap {
                self.tail.pop_front();
            }
            self.tail.push_back(self.line.clone());
        }
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    pub(crate) fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }
}
