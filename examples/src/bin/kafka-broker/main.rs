//! `kafka-broker`: an example Kafka-protocol broker that serves **diskless topics** (KIP-1150) with
//! diskless-rs — the embedding a host broker does, small enough to read in one sitting.
//!
//! One process runs several logical brokers (node ids 1..=N, each with its own listener and rack).
//! Every broker accepts Produce and Fetch for every partition: Produce goes through that broker's
//! [`diskless_core::WalWriter`] (one WAL segment per commit interval, whatever the partitions), Fetch
//! through the shared [`diskless_core::Fetcher`] and object cache. Topics, offsets, idempotent-producer
//! state and producer-id blocks live in the batch coordinator (SQLite by default, PostgreSQL or
//! in-memory by flag); committed consumer-group offsets and group metadata in a SQLite file of the
//! data directory. With `--shards N` the coordinator is N shards under a
//! [`diskless_coordinator::sharded::ShardedCoordinator`] (KIP-1164), and Metadata announces each
//! partition's produce gateway (KIP-1163) as its leader. ARCHITECTURE.md lists the Kafka APIs served.
//!
//! ```text
//! cargo run -p diskless-examples --bin kafka-broker -- --data-dir ./diskless-data
//! kcat -b 127.0.0.1:19092 -L
//! ```
//!
//! Modules: [`config`] (command line), [`broker`] (building the shared state), [`server`]
//! (listeners, framing, in-order dispatch), [`cluster`] (the logical brokers, leaders and racks),
//! [`topics`] (the topic registry over the coordinator), [`api_versions`], [`metadata`] (Metadata,
//! CreateTopics, DeleteTopics), [`admin_configs`] (DescribeConfigs, IncrementalAlterConfigs,
//! AlterConfigs), [`admin_partitions`] (CreatePartitions), [`describe_partitions`]
//! (DescribeTopicPartitions), [`cluster_admin`] (DescribeCluster, DescribeProducers), [`produce`]
//! (Produce, InitProducerId with producer-id blocks), [`fetch`] and [`fetch_session`] (Fetch with
//! KIP-227 sessions, ListOffsets, DeleteRecords), [`groups`] (the classic group protocol, static
//! membership, ListGroups/DescribeGroups/DeleteGroups), [`offsets`] (OffsetCommit, OffsetFetch,
//! OffsetDelete), [`txn`] (the transaction coordinator: InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, timeouts, Describe/ListTransactions),
//! [`store`] (committed offsets, group metadata and transactions in SQLite), [`metrics`]
//! (`--metrics-addr`), `alloc_guard` (malformed array lengths must not abort the process).

mod admin_configs;
mod admin_partitions;
#[cfg(unix)]
#[allow(unsafe_code)] // The explicit opt-out: a global allocator cannot be written without it.
mod alloc_guard;
mod api_versions;
mod broker;
mod cluster;
mod cluster_admin;
mod codes;
mod config;
mod describe_partitions;
mod fetch;
mod fetch_session;
mod groups;
mod metadata;
mod metrics;
mod offsets;
mod produce;
mod server;
mod store;
mod topics;
mod txn;

/// A fresh random id (topic ids, consumer group member ids): unique, not reproducible — this is
/// an application, not library code, so it draws from the OS's entropy (UUID v4 layout).
pub(crate) fn random_uuid() -> uuid::Uuid {
    let bits = fastrand::Rng::with_seed(diskless_common::entropy_seed()).u128(..);
    uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid()
}

use std::io::IsTerminal;
use std::process::ExitCode;

use tracing::error;
use tracing_subscriber::EnvFilter;

/// See [`alloc_guard`]: a malformed array length must not abort the process.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: alloc_guard::GuardedAllocator = alloc_guard::GuardedAllocator;

#[allow(clippy::print_stdout, clippy::print_stderr)] // `--help` and start-up errors go to the terminal.
fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = match config::Config::parse(std::env::args().skip(1)) {
        Ok(config::Parsed::Run(config)) => *config,
        Ok(config::Parsed::Help) => {
            println!("{}", config::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kafka-broker: {e}\n\n{}", config::USAGE);
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kafka-broker: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("kafka-broker failed: {e}");
            ExitCode::FAILURE
        }
    }
}
