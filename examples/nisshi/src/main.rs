//! `nisshi-diskless`: Nisshi (tansu 0.6.0) with diskless topics. `--help` lists the options.

use clap::Parser;
use diskless_nisshi::config::Config;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = Config::parse();
    let mut running = match diskless_nisshi::run::start(&config, None).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = tokio::select! {
        ended = running.wait() => match ended {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                std::process::ExitCode::FAILURE
            }
        },
        _ = tokio::signal::ctrl_c() => std::process::ExitCode::SUCCESS,
    };
    running.shutdown().await;
    code
}
