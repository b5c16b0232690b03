//! The example Kafka-protocol broker that serves **diskless topics** (KIP-1150) with diskless-rs —
//! the embedding a host broker does, small enough to read in one sitting. The `kafka-broker` binary
//! (`src/main.rs`) parses the command line ([`Config`]) and runs it ([`run`]).
//!
//! One process runs several logical brokers (node ids 1..=N, each with its own listener and rack).
//! Every broker accepts Produce and Fetch for every partition: Produce goes through that broker's
//! [`diskless_core::WalWriter`] (one WAL segment per commit interval, whatever the partitions), Fetch
//! through the shared [`diskless_core::Fetcher`] and object cache. Topics, offsets, idempotent-producer
//! state and producer-id blocks live in the batch coordinator (SQLite by default, PostgreSQL by flag,
//! in-memory with the `testkit` feature); committed consumer-group offsets and group metadata in a SQLite file of the
//! data directory. With `--shards N` the coordinator is N shards under a
//! [`diskless_coordinator::sharded::ShardedCoordinator`] (KIP-1164), and Metadata announces each
//! partition's produce gateway (KIP-1163) as its leader. ARCHITECTURE.md lists the Kafka APIs served.
//!
//! ```text
//! cargo run -p diskless-kafka-broker --bin kafka-broker -- --data-dir ./diskless-data
//! kcat -b 127.0.0.1:19092 -L
//! ```
//!
//! The modules, in layers; each uses only modules listed before it (`tests/module_graph.rs` fails
//! on an import cycle):
//!
//! 1. Foundations: `config` (command line), `codes` (Kafka error codes), `ctx` (the request
//!    context, response encoding and error answers every handler shares), `cluster` (the logical
//!    brokers, leaders and racks), `authz` (the authorized operations of an authorizer-less
//!    broker), `fetch_session` (KIP-227 session state), `alloc_guard`
//!    (malformed array lengths must not abort the process).
//! 2. State: `txn_coordinator` (the transaction coordinator's state and Kafka's rules for it),
//!    `store` (committed offsets, group metadata and transactions in `broker.db`), `topics` (the
//!    topic registry over the coordinator), `group_coordinator` (the classic group protocol's state
//!    machine, static membership), `producer_ids` (producer-id blocks), `broker` (the state shared
//!    by every logical broker, built from the configuration).
//! 3. Request handlers, each given the `Broker` and a `Ctx`: `api_versions`, `admin_configs`
//!    (DescribeConfigs, IncrementalAlterConfigs, AlterConfigs), `admin_partitions`
//!    (CreatePartitions), `cluster_admin` (DescribeCluster, DescribeProducers), `metadata`
//!    (Metadata, CreateTopics, DeleteTopics), `describe_partitions` (DescribeTopicPartitions),
//!    `fetch` (Fetch with KIP-227 sessions, ListOffsets, DeleteRecords), `groups` (FindCoordinator,
//!    JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups, DeleteGroups),
//!    `offsets` (OffsetCommit, OffsetFetch, OffsetDelete), `txn` (the transaction coordinator at
//!    work: InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
//!    TxnOffsetCommit, EndTxn, markers, timeouts, Describe/ListTransactions), `produce` (Produce,
//!    InitProducerId).
//! 4. `server`: listeners, framing, in-order dispatch to the handlers, start and shutdown.

mod admin_configs;
mod admin_partitions;
#[cfg(unix)]
#[allow(unsafe_code)] // The explicit opt-out: a global allocator cannot be written without it.
mod alloc_guard;
mod api_versions;
mod authz;
mod broker;
mod cluster;
mod cluster_admin;
mod codes;
mod config;
mod ctx;
mod describe_partitions;
mod fetch;
mod fetch_session;
mod group_coordinator;
mod groups;
mod metadata;
mod offsets;
mod produce;
mod producer_ids;
mod server;
mod store;
mod topics;
mod txn;
mod txn_coordinator;

#[cfg(unix)]
pub use alloc_guard::GuardedAllocator;
pub use config::{Config, Parsed, USAGE};
pub use server::run;

/// The unit tests run under the binary's allocator too (`alloc_guard`'s test needs it).
#[cfg(all(test, unix))]
#[global_allocator]
static ALLOCATOR: alloc_guard::GuardedAllocator = alloc_guard::GuardedAllocator;

/// A fresh random id (topic ids, consumer group member ids): unique, not reproducible — this is
/// an application, not library code, so it draws from the OS's entropy (UUID v4 layout).
pub(crate) fn random_uuid() -> uuid::Uuid {
    let bits = fastrand::Rng::with_seed(diskless_common::entropy_seed()).u128(..);
    uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid()
}
