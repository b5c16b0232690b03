//! Serving one Kafka client connection so that diskless Produce requests overlap.
//!
//! A diskless Produce is answered only after its WAL segment is uploaded and committed (tens to
//! hundreds of milliseconds), where a classic broker answers in about a millisecond. A host that
//! handles a connection's requests strictly one after another (read, handle, answer, read the
//! next) makes an idempotent producer's pipelined requests (up to 5 in flight) wait for each
//! other's commits: one request, one segment, one commit at a time. Measured through Nisshi
//! (tansu 0.6.0, whose listener does exactly that): produce at 0.22x this project's example broker
//! and four times its PUTs (BENCHMARKS.md, "Nisshi: throughput").
//!
//! [`serve`] reads a connection's requests and writes the answers with Kafka's ordering, keeping
//! consecutive Produce requests in flight together:
//!
//! - requests take effect in the order they arrive: a request starts only once every earlier
//!   request of the connection is answered, as on a Kafka broker, which reads a connection's next
//!   request only after answering the previous one;
//! - except that consecutive Produce requests overlap: the host's dispatch resolves once a
//!   Produce's effect is ordered (its batches are in the [`crate::WalWriter`], whose
//!   [`append`](crate::WalWriter::append) keeps call order), and the next Produce is read while
//!   the first waits for its commit; an idempotent producer's sequence order holds;
//! - answers are written in request order (Kafka's rule); a request the host cannot serve ends the
//!   connection after the earlier answers.
//!
//! The host keeps its own decoding and handlers: it gives a `dispatch` function from one request
//! frame to the task computing its answer.
//!
//! ```
//! use bytes::Bytes;
//! use diskless_core::connection::{serve, ConnectionLimits, RequestFrame};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (client, server) = tokio::io::duplex(1 << 16);
//! let (rd, wr) = tokio::io::split(server);
//! // A toy host: answers each request with its correlation id and an empty body.
//! let task = tokio::spawn(serve(rd, wr, ConnectionLimits::default(), "peer", |frame: RequestFrame| async move {
//!     let request = frame.request();
//!     let mut answer = vec![0, 0, 0, 4];
//!     answer.extend_from_slice(&request[4..8]); // the correlation id
//!     Ok(Some(tokio::spawn(async move { Ok(Some(Bytes::from(answer))) })))
//! }));
//! let (mut crd, mut cwr) = tokio::io::split(client);
//! // ApiVersions (key 18) v0 with correlation id 7: size, key, version, id, client id (null).
//! cwr.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 7, 0xff, 0xff]).await.unwrap();
//! let mut answer = [0u8; 8];
//! crd.read_exact(&mut answer).await.unwrap();
//! assert_eq!(answer, [0, 0, 0, 4, 0, 0, 0, 7]);
//! drop((crd, cwr));
//! task.await.unwrap();
//! # }
//! ```

use std::fmt::Display;
use std::future::Future;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// The API key of Produce.
const PRODUCE: i16 = 0;

/// Bounds of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// Largest request frame accepted, in bytes (Kafka's `socket.request.max.bytes`, 100 MiB); a
    /// larger announced size closes the connection before anything is allocated for it.
    pub max_frame: usize,
    /// Requests of one connection being handled or waiting to be answered (32).
    pub max_in_flight: usize,
}

impl ConnectionLimits {
    /// These limits with `max_frame` bytes as the largest request.
    pub fn with_max_frame(mut self, max_frame: usize) -> Self {
        self.max_frame = max_frame;
        self
    }

    /// These limits with `max_in_flight` requests per connection (at least 1 is used).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_frame: 100 << 20,
            max_in_flight: 32,
        }
    }
}

/// One request as read from the connection: its 4-byte size, then the request header and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFrame(Bytes);

impl RequestFrame {
    /// The request (header and body), without the size.
    pub fn request(&self) -> Bytes {
        self.0.slice(4..)
    }

    /// The frame as read, size first (what decoders of whole frames expect).
    pub fn sized(&self) -> Bytes {
        self.0.clone()
    }

    /// The request header's API key, if the request is long enough to have one.
    pub fn api_key(&self) -> Option<i16> {
        (self.0.len() >= 6).then(|| i16::from_be_bytes([self.0[4], self.0[5]]))
    }
}

/// The task answering one request: the encoded response, size first (`None`: no response, as for
/// an `acks=0` Produce), or why the connection must close.
pub type Answer = JoinHandle<Result<Option<Bytes>, String>>;

/// Serves one connection until the peer closes it, a frame is malformed or too large, or a
/// request fails. See the [module documentation](self).
///
/// `dispatch` is called with each request in order, never with two at once; it resolves once the
/// request's effect is ordered — for a Produce, once its batches are in the writer — with the task
/// that answers it (`Ok(None)`: nothing to answer), or with why the connection must close.
/// `peer` names the connection in log lines.
pub async fn serve<R, W, F, Fut>(
    mut rd: R,
    wr: W,
    limits: ConnectionLimits,
    peer: impl Display + Send + Sync + 'static,
    mut dispatch: F,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
    F: FnMut(RequestFrame) -> Fut,
    Fut: Future<Output = Result<Option<Answer>, String>>,
{
    let peer = std::sync::Arc::new(peer);
    let (tx, rx) = mpsc::channel::<Answer>(limits.max_in_flight.max(1));
    // How many answers the writer has finished (written, or completed without a response).
    let (done_tx, mut done) = watch::channel(0u64);
    let writer = tokio::spawn(write_loop(wr, rx, peer.clone(), done_tx));
    let mut sent = 0u64;
    let mut previous_was_produce = false;
    loop {
        let frame = tokio::select! {
            frame = read_frame(&mut rd, limits.max_frame) => frame,
            _ = tx.closed() => break,
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                warn!(peer = %peer, "closing connection: {e}");
                break;
            }
        };
        let is_produce = frame.api_key() == Some(PRODUCE);
        // Every earlier request answered first, but for a Produce after a Produce; a closed
        // writer (the connection is closing) ends the wait too.
        if !(is_produce && previous_was_produce)
            && sent > 0
            && done.wait_for(|n| *n >= sent).await.is_err()
        {
            break;
        }
        previous_was_produce = is_produce;
        match dispatch(frame).await {
            Ok(Some(answer)) => {
                if tx.send(answer).await.is_err() {
                    break;
                }
                sent += 1;
            }
            Ok(None) => {}
            Err(e) => {
                warn!(peer = %peer, "closing connection: {e}");
                break;
            }
        }
    }
    drop(tx);
    // Answer what was accepted before closing.
    let _ = writer.await;
}

/// Reads one size-prefixed frame; `None` at a clean end of stream.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max_frame: usize,
) -> Result<Option<RequestFrame>, String> {
    let mut len = [0u8; 4];
    match rd.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("read failed: {e}")),
    }
    let size = i32::from_be_bytes(len);
    let size = usize::try_from(size).map_err(|_| format!("negative frame size {size}"))?;
    if size > max_frame {
        return Err(format!(
            "frame of {size} bytes exceeds the limit of {max_frame}"
        ));
    }
    // Grow with what actually arrives: announcing a large frame costs a peer nothing.
    let mut buf = Vec::with_capacity(4 + size.min(64 << 10));
    buf.extend_from_slice(&len);
    let read = (&mut *rd)
        .take(size as u64)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    if read != size {
        return Err(format!("truncated frame: {read} of {size} announced bytes"));
    }
    Ok(Some(RequestFrame(Bytes::from(buf))))
}

/// Writes the answers in request order, counting each in `done`.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Answer>,
    peer: std::sync::Arc<impl Display>,
    done: watch::Sender<u64>,
) {
    while let Some(answer) = rx.recv().await {
        match answer.await {
            Ok(Ok(Some(bytes))) => {
                if let Err(e) = wr.write_all(&bytes).await {
                    debug!(peer = %peer, error = %e, "write failed");
                    break;
                }
                done.send_modify(|n| *n += 1);
            }
            Ok(Ok(None)) => {
                done.send_modify(|n| *n += 1);
            }
            Ok(Err(e)) => {
                warn!(peer = %peer, "closing connection: {e}");
                break;
            }
            Err(e) => {
                warn!(peer = %peer, "closing connection: a request handler failed: {e}");
                break;
            }
        }
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Notify;

    /// A request frame: size, API key, version 0, correlation id.
    fn frame(api_key: i16, correlation_id: i32) -> Vec<u8> {
        let mut f = 8i32.to_be_bytes().to_vec();
        f.extend_from_slice(&api_key.to_be_bytes());
        f.extend_from_slice(&0i16.to_be_bytes());
        f.extend_from_slice(&correlation_id.to_be_bytes());
        f
    }

    fn correlation_id(frame: &RequestFrame) -> i32 {
        let r = frame.request();
        i32::from_be_bytes([r[4], r[5], r[6], r[7]])
    }

    /// The test hosts' answer to request `id`: a 4-byte body holding the id.
    fn answer(id: i32) -> Bytes {
        Bytes::from([4i32.to_be_bytes(), id.to_be_bytes()].concat())
    }

    type Client = (
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    );

    /// A connection served by [`serve`] with `limits` and `dispatch` over an in-memory pipe: the
    /// client's halves and the server's task.
    fn connect<F, Fut>(limits: ConnectionLimits, dispatch: F) -> (Client, JoinHandle<()>)
    where
        F: FnMut(RequestFrame) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<Answer>, String>> + Send + 'static,
    {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (rd, wr) = tokio::io::split(server);
        let server = tokio::spawn(serve(rd, wr, limits, "test", dispatch));
        (tokio::io::split(client), server)
    }

    /// Writes `bytes`, ends the client's sending side, and reads everything the server writes
    /// until it closes the connection.
    async fn send_all_then_read_all(client: Client, bytes: &[u8]) -> Vec<u8> {
        let (mut crd, mut cwr) = client;
        cwr.write_all(bytes).await.unwrap();
        cwr.shutdown().await.unwrap();
        let mut rest = Vec::new();
        crd.read_to_end(&mut rest).await.unwrap();
        rest
    }

    /// A host whose Produce answers wait for `commit`; every answer is the correlation id. Records
    /// the order requests were dispatched in and how many answers were running at once.
    struct Host {
        commit: Arc<Notify>,
        dispatched: Arc<parking_lot::Mutex<Vec<i32>>>,
        running: Arc<AtomicUsize>,
        most_running: Arc<AtomicUsize>,
    }

    async fn run(requests: Vec<Vec<u8>>, release_after: usize) -> (Vec<i32>, Vec<i32>, usize) {
        let host = Host {
            commit: Arc::new(Notify::new()),
            dispatched: Arc::default(),
            running: Arc::default(),
            most_running: Arc::default(),
        };
        let (commit, dispatched, running, most) = (
            host.commit.clone(),
            host.dispatched.clone(),
            host.running.clone(),
            host.most_running.clone(),
        );
        let ((mut crd, mut cwr), server) =
            connect(ConnectionLimits::default(), move |f: RequestFrame| {
                let id = correlation_id(&f);
                dispatched.lock().push(id);
                let (commit, running, most) = (commit.clone(), running.clone(), most.clone());
                async move {
                    let n = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    Ok(Some(tokio::spawn(async move {
                        if f.api_key() == Some(PRODUCE) {
                            commit.notified().await;
                        }
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok(Some(answer(id)))
                    })))
                }
            });
        let n = requests.len();
        cwr.write_all(&requests.concat()).await.unwrap();
        // Let the server read what it will before any commit.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        let before_release = host.dispatched.lock().len();
        assert!(before_release >= release_after.min(n));
        let notify = host.commit.clone();
        let releaser = tokio::spawn(async move {
            loop {
                notify.notify_waiters();
                tokio::task::yield_now().await;
            }
        });
        let mut answered = Vec::new();
        for _ in 0..n {
            let mut a = [0u8; 8];
            crd.read_exact(&mut a).await.unwrap();
            answered.push(i32::from_be_bytes([a[4], a[5], a[6], a[7]]));
        }
        releaser.abort();
        drop((crd, cwr));
        server.await.unwrap();
        let dispatched = host.dispatched.lock().clone();
        (
            dispatched,
            answered,
            host.most_running.load(Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn consecutive_produces_overlap_and_answer_in_order() {
        let requests = vec![frame(0, 1), frame(0, 2), frame(0, 3)];
        let (dispatched, answered, most) = run(requests, 3).await;
        assert_eq!(dispatched, [1, 2, 3]);
        assert_eq!(answered, [1, 2, 3]);
        assert_eq!(
            most, 3,
            "the three Produce requests were in flight together"
        );
    }

    #[tokio::test]
    async fn any_other_request_waits_for_the_earlier_answers() {
        // Produce, Fetch (1), Produce: the Fetch starts only after the first Produce's answer.
        let requests = vec![frame(0, 1), frame(1, 2), frame(0, 3)];
        let (dispatched, answered, most) = run(requests, 1).await;
        assert_eq!(dispatched, [1, 2, 3]);
        assert_eq!(answered, [1, 2, 3]);
        assert_eq!(most, 1, "never two requests at once");
    }

    #[tokio::test]
    async fn a_smaller_frame_limit_is_kept() {
        let (client, server) = connect(
            ConnectionLimits::default()
                .with_max_frame(7)
                .with_max_in_flight(1),
            |_f: RequestFrame| async { Ok(Some(tokio::spawn(async { Ok(Some(answer(1))) }))) },
        );
        // An 8-byte request against a 7-byte limit: closed without an answer.
        assert!(
            send_all_then_read_all(client, &frame(0, 1))
                .await
                .is_empty()
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn bad_frames_close_the_connection() {
        for bytes in [
            (-1i32).to_be_bytes().to_vec(),
            ((100i32 << 20) + 1).to_be_bytes().to_vec(),
            // Announces 8 bytes, sends 2, then ends.
            [8i32.to_be_bytes().to_vec(), vec![0, 0]].concat(),
        ] {
            let calls = Arc::new(AtomicUsize::new(0));
            let c = calls.clone();
            let (client, server) = connect(ConnectionLimits::default(), move |_f: RequestFrame| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Ok(None) }
            });
            assert!(send_all_then_read_all(client, &bytes).await.is_empty());
            server.await.unwrap();
            assert_eq!(calls.load(Ordering::SeqCst), 0, "{bytes:?}");
        }
    }

    #[tokio::test]
    async fn a_failed_request_ends_the_connection_after_the_earlier_answers() {
        let (client, server) = connect(ConnectionLimits::default(), |f: RequestFrame| async move {
            let id = correlation_id(&f);
            if id == 2 {
                return Err("cannot decode".to_string());
            }
            Ok(Some(tokio::spawn(async move { Ok(Some(answer(id))) })))
        });
        let requests = [frame(0, 1), frame(0, 2), frame(0, 3)].concat();
        assert_eq!(send_all_then_read_all(client, &requests).await, answer(1));
        server.await.unwrap();
    }
}
