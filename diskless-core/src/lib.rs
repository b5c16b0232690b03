//! Kafka RecordBatch v2 and WAL segment formats, and the `WalWriter` / `Fetcher` façade of diskless
//! topics (work in progress).
