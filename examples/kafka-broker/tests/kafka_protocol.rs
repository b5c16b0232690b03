//! The example broker's protocol edges, with hand-built frames (no Kafka client needed): ApiVersions
//! of known and unknown versions, unknown API keys, malformed frames. The broker must answer what it
//! can, close the connection otherwise, and keep serving other connections.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(data_dir: &Path) -> (Broker, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_kafka-broker"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listeners", &format!("127.0.0.1:{port}")])
        .args(["--coordinator", "memory://"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut broker = Broker(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(broker.0.try_wait().unwrap().is_none(), "broker exited");
        assert!(Instant::now() < deadline, "broker did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (broker, port)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// A request frame with a version-1 header (non-flexible).
fn request(api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&api_key.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&correlation_id.to_be_bytes());
    frame.extend_from_slice(&4i16.to_be_bytes());
    frame.extend_from_slice(b"test");
    frame.extend_from_slice(body);
    let mut out = (frame.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&frame);
    out
}

fn read_response(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// Whether the broker closed the connection.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

/// Parses an ApiVersions v0 response body: (correlation id, error code, [(key, min, max)]).
fn parse_api_versions(body: &[u8]) -> (i32, i16, Vec<(i16, i16, i16)>) {
    let i32_at = |at: usize| i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    let i16_at = |at: usize| i16::from_be_bytes(body[at..at + 2].try_into().unwrap());
    let correlation = i32_at(0);
    let error = i16_at(4);
    let n = i32_at(6) as usize;
    let apis = (0..n)
        .map(|i| {
            let at = 10 + i * 6;
            (i16_at(at), i16_at(at + 2), i16_at(at + 4))
        })
        .collect();
    (correlation, error, apis)
}

fn assert_alive(port: u16) {
    let mut s = connect(port);
    s.write_all(&request(18, 0, 99, &[])).unwrap();
    let body = read_response(&mut s).expect("the broker answers new connections");
    let (correlation, error, apis) = parse_api_versions(&body);
    assert_eq!((correlation, error), (99, 0));
    assert!(
        apis.iter()
            .any(|&(key, min, max)| key == 0 && min <= 3 && max >= 3)
    );
}

#[test]
fn protocol_edges_get_kafka_answers_and_never_crash_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, port) = start(dir.path());

    // ApiVersions v0: the supported APIs.
    assert_alive(port);

    // ApiVersions of a version from the future: UNSUPPORTED_VERSION in a v0 response, with the list.
    let mut s = connect(port);
    s.write_all(&request(18, 99, 7, &[])).unwrap();
    let (correlation, error, apis) = parse_api_versions(&read_response(&mut s).unwrap());
    assert_eq!((correlation, error), (7, 35));
    assert!(apis.iter().any(|&(key, _, _)| key == 1), "Fetch advertised");
    // The connection stays usable.
    s.write_all(&request(18, 0, 8, &[])).unwrap();
    assert_eq!(parse_api_versions(&read_response(&mut s).unwrap()).0, 8);

    // An API this broker does not serve: the connection is closed.
    let mut s = connect(port);
    s.write_all(&request(9999, 0, 1, &[])).unwrap();
    assert!(closed(&mut s));
    let mut s = connect(port);
    s.write_all(&request(32, 1, 1, &[])).unwrap(); // DescribeConfigs: not served
    assert!(closed(&mut s));

    // Malformed frames.
    let cases: Vec<Vec<u8>> = vec![
        (-5i32).to_be_bytes().to_vec(),          // negative size
        (200_000_000i32).to_be_bytes().to_vec(), // too large
        [3i32.to_be_bytes().to_vec(), vec![0, 18, 0]].concat(), // shorter than a header
        request(3, 1, 1, &[0, 0]),               // Metadata body truncated
        request(3, 1, 1, &0x7fff_ffffi32.to_be_bytes()), // Metadata: absurd array length
        request(0, 3, 1, &[0xff; 40]),           // Produce: garbage
        {
            let mut f = request(18, 0, 1, &[]);
            f.truncate(f.len() - 2); // client id cut short, then the peer goes away
            f
        },
    ];
    for (i, frame) in cases.into_iter().enumerate() {
        let mut s = connect(port);
        s.write_all(&frame).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(closed(&mut s), "case {i}: the connection must be closed");
        assert!(
            broker.0.try_wait().unwrap().is_none(),
            "case {i}: the broker process died"
        );
        assert_alive(port);
    }
    assert!(broker.0.try_wait().unwrap().is_none());
}
