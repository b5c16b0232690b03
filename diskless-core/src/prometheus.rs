//! The library's metrics (see `diskless_common::metrics`) in Prometheus text format, on a plain
//! HTTP endpoint (`curl http://127.0.0.1:9464/metrics`), for hosts (feature `prometheus`; the
//! example broker's and the Nisshi host's `--metrics-addr`).
//!
//! The library only emits through the `metrics` facade; [`install`] makes the Prometheus recorder
//! of `metrics-exporter-prometheus` the process's recorder, with the buckets the library's
//! histograms are meant for, and [`serve`] answers scrapes itself (one small HTTP/1.1 handler on
//! the host's runtime, so no second HTTP stack is pulled in). A host with its own recorder or
//! HTTP server needs neither: the catalogue is `diskless_common::metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
pub use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// Histogram buckets (seconds) for the latency series: 1 ms to 10 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Histogram buckets for segment sizes (bytes): 1 KiB to 64 MiB.
const BYTES_BUCKETS: &[f64] = &[
    1024.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    8_388_608.0,
    16_777_216.0,
    67_108_864.0,
];

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrometheusError {
    /// The recorder could not be built or installed (e.g. a recorder is already installed).
    #[error("metrics: cannot install the Prometheus recorder: {0}")]
    Install(String),
    /// The endpoint's address could not be bound.
    #[error("metrics: cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Installs the Prometheus recorder as the process's `metrics` recorder and describes the
/// library's series (`diskless_common::metrics::describe`). Call before the storage and the
/// coordinator are opened, so every series is kept from the start; a process has one recorder
/// (a second call fails).
pub fn install() -> Result<PrometheusHandle, PrometheusError> {
    use diskless_common::metrics as m;
    let seconds = [
        m::PRODUCE_SECONDS,
        m::UPLOAD_SECONDS,
        m::COMMIT_SECONDS,
        m::FETCH_SECONDS,
        m::STORAGE_SECONDS,
        m::COORDINATOR_SECONDS,
    ];
    let mut builder = PrometheusBuilder::new();
    for name in seconds {
        builder = builder
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(name.to_string()),
                SECONDS_BUCKETS,
            )
            .map_err(|e| PrometheusError::Install(e.to_string()))?;
    }
    builder = builder
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(m::SEGMENT_BYTES.to_string()),
            BYTES_BUCKETS,
        )
        .map_err(|e| PrometheusError::Install(e.to_string()))?;
    let handle = builder
        .install_recorder()
        .map_err(|e| PrometheusError::Install(e.to_string()))?;
    m::describe();
    Ok(handle)
}

/// [`bind`], [`install`] and [`serve`] in a spawned task: the endpoint of a host's
/// `--metrics-addr`, serving until the returned task is aborted. Call it first (see [`install`]).
pub async fn start(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>, PrometheusError> {
    let listener = bind(addr).await?;
    let handle = install()?;
    Ok(tokio::spawn(serve(listener, handle)))
}

/// Binds the metrics endpoint (so that a taken port fails the start, not a background task).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, PrometheusError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| PrometheusError::Bind { addr, source })?;
    info!(%addr, "metrics in Prometheus text format at http://{addr}/metrics");
    Ok(listener)
}

/// Serves `GET /metrics` (any path, in fact) until the task is aborted.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Histograms are summarised lazily; upkeep keeps their memory bounded between scrapes.
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &handle).await {
                debug!(%peer, error = %e, "metrics: request failed");
            }
        });
    }
}

/// Reads one request's head (bounded) and answers with the current rendering.
async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 || head.len() + n > 16 * 1024 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, body) = if head.starts_with(b"GET ") {
        ("200 OK", handle.render())
    } else {
        ("405 Method Not Allowed", String::from("only GET\n"))
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
