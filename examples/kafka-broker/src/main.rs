//! `kafka-broker`: an example Kafka-protocol broker that serves **diskless topics** (KIP-1150) with
//! diskless-rs. The broker is the `diskless_kafka_broker` library; this binary parses the command
//! line, sets up logging and the runtime, and runs it until Ctrl-C or SIGTERM.
//!
//! ```text
//! cargo run -p diskless-kafka-broker --bin kafka-broker -- --data-dir ./diskless-data
//! kcat -b 127.0.0.1:19092 -L
//! ```

use std::io::IsTerminal;
use std::process::ExitCode;

use diskless_kafka_broker::{Config, Parsed, USAGE};
use tracing::error;
use tracing_subscriber::EnvFilter;

/// See `alloc_guard` of the library: a malformed array length must not abort the process.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: diskless_kafka_broker::GuardedAllocator = diskless_kafka_broker::GuardedAllocator;

#[allow(clippy::print_stdout, clippy::print_stderr)] // `--help` and start-up errors go to the terminal.
fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = match Config::parse(std::env::args().skip(1)) {
        Ok(Parsed::Run(config)) => *config,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kafka-broker: {e}\n\n{USAGE}");
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
    match runtime.block_on(diskless_kafka_broker::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("kafka-broker failed: {e}");
            ExitCode::FAILURE
        }
    }
}
