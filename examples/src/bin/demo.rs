//! The single-process demo of diskless-rs (local files + SQLite). Not yet: it lands with the
//! produce/fetch path.

fn main() {
    eprintln!("demo: not yet — the produce/fetch path (WalWriter/Fetcher) has not landed");
}
