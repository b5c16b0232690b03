//! Shared by the integration tests that start the example broker binary and drive it with real
//! Kafka clients: the broker process, free ports, and the skip rule (`skipped: ...` unless
//! `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`).

#![allow(dead_code)] // Each test file uses its own subset.

use std::fs::File;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why python3 with confluent_kafka cannot run here, if it cannot.
pub(crate) fn python_clients_missing() -> Option<String> {
    let python = Command::new("python3")
        .args(["-c", "import confluent_kafka"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !python.is_ok_and(|s| s.success()) {
        return Some("python3 with the confluent_kafka module is not installed".into());
    }
    None
}

/// Why kcat cannot run here, if it cannot.
pub(crate) fn kcat_missing() -> Option<String> {
    let kcat = Command::new("kcat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !kcat.is_ok_and(|s| s.success()) {
        return Some("kcat is not installed".into());
    }
    None
}

/// Whether a test can run given `missing`; `false` (after printing why) when it should be skipped.
/// With `DISKLESS_REQUIRE_KAFKA_CLIENTS=1` a missing client fails the test instead.
#[allow(clippy::print_stdout)] // The skip notice is the point.
pub(crate) fn available(missing: Option<String>) -> bool {
    if let Some(why) = missing {
        if std::env::var("DISKLESS_REQUIRE_KAFKA_CLIENTS").as_deref() == Ok("1") {
            panic!("DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but {why}");
        }
        println!("skipped: {why}");
        return false;
    }
    true
}

/// `n` loopback ports free right now.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A running `kafka-broker` process (killed on drop).
pub(crate) struct Broker {
    child: Child,
    log: PathBuf,
    /// `HOST:PORT,...` of its listeners.
    pub(crate) bootstrap: String,
}

impl Broker {
    /// The command that starts the broker on `ports` with a data directory `data_dir` (50 ms
    /// commit interval, 500 ms retention checks) and `extra` arguments, and the path of its log.
    pub(crate) fn command(
        data_dir: &Path,
        ports: &[u16],
        run: usize,
        extra: &[&str],
    ) -> (Command, PathBuf) {
        let listeners: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        std::fs::create_dir_all(data_dir).unwrap();
        let log = data_dir.join(format!("broker-{run}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_kafka-broker"));
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listeners", &listeners.join(",")])
            .args(["--commit-interval-ms", "50"])
            .args(["--retention-check-ms", "500"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        (command, log)
    }

    /// Starts the broker (see [`Broker::command`]) and waits until every listener accepts
    /// connections.
    pub(crate) fn start(data_dir: &Path, ports: &[u16], run: usize, extra: &[&str]) -> Broker {
        let (mut command, log) = Broker::command(data_dir, ports, run, extra);
        let listeners: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut broker = Broker {
            child: command.spawn().unwrap(),
            log,
            bootstrap: listeners.join(","),
        };
        broker.wait_ready(ports);
        broker
    }

    /// SIGTERM, then waits for the graceful shutdown (which must succeed).
    pub(crate) fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "kafka-broker exited with {status}:\n{}",
                    self.log_text()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("kafka-broker did not stop on SIGTERM:\n{}", self.log_text());
    }

    /// The broker's log so far.
    pub(crate) fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn wait_ready(&mut self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kafka-broker exited with {status}:\n{}", self.log_text());
            }
            if ports
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kafka-broker did not listen in time:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `python3 script args...`; fails the test (with the script's output and the broker's log)
/// unless it exits 0.
#[allow(clippy::print_stdout)] // The script's report.
pub(crate) fn run_python(broker: &Broker, script: &str, args: &[&str]) {
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {script} {args:?} ---\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n{stdout}\n{stderr}\n--- broker log ---\n{}",
        out.status,
        broker.log_text()
    );
}

// ---------------------------------------------------------------------------------------------
// The Kafka protocol by hand (the client side of `kafka-protocol`)

/// A size-prefixed request frame: header (the version the body's version calls for), then body.
pub(crate) fn frame<
    R: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
>(
    api: kafka_protocol::messages::ApiKey,
    version: i16,
    id: i32,
    client_id: &str,
    body: &R,
) -> Vec<u8> {
    use kafka_protocol::protocol::Encodable as _;
    let mut header = kafka_protocol::messages::RequestHeader::default();
    header.request_api_key = api as i16;
    header.request_api_version = version;
    header.correlation_id = id;
    header.client_id = Some(kafka_protocol::protocol::StrBytes::from_string(
        client_id.to_string(),
    ));
    let mut buf = bytes::BytesMut::new();
    header.encode(&mut buf, R::header_version(version)).unwrap();
    body.encode(&mut buf, version).unwrap();
    let mut out = (buf.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

/// Reads one response frame and checks that it answers request `id`.
pub(crate) fn response<
    R: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
>(
    s: &mut TcpStream,
    version: i16,
    id: i32,
) -> R {
    use kafka_protocol::protocol::Decodable as _;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    let mut buf = bytes::Bytes::from(body);
    let header =
        kafka_protocol::messages::ResponseHeader::decode(&mut buf, R::header_version(version))
            .unwrap();
    assert_eq!(header.correlation_id, id, "answers come in request order");
    R::decode(&mut buf, version).unwrap()
}

/// One client connection speaking the Kafka protocol: requests one at a time, each answer
/// checked against its correlation id.
pub(crate) struct Conn {
    stream: TcpStream,
    correlation: i32,
    client_id: &'static str,
}

impl Conn {
    /// Connects to the loopback `port` (reads time out after 60 s: a hang fails the test).
    pub(crate) fn open(port: u16, client_id: &'static str) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Conn {
            stream,
            correlation: 0,
            client_id,
        }
    }

    /// Sends `request` as `api` version `version` and reads its answer.
    pub(crate) fn call<Req, Resp>(
        &mut self,
        api: kafka_protocol::messages::ApiKey,
        version: i16,
        request: &Req,
    ) -> Resp
    where
        Req: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
        Resp: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        use std::io::Write as _;
        self.correlation += 1;
        let frame = frame(api, version, self.correlation, self.client_id, request);
        self.stream.write_all(&frame).unwrap();
        response(&mut self.stream, version, self.correlation)
    }
}

/// A sessionless Fetch of partition 0 of `topic` from `offset` (no wait, up to
/// `partition_max_bytes` of the partition and 1 MiB in all), by topic name (versions up to 12).
pub(crate) fn fetch_request(
    topic: &str,
    offset: i64,
    partition_max_bytes: i32,
) -> kafka_protocol::messages::FetchRequest {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = offset;
    p.partition_max_bytes = partition_max_bytes;
    p.current_leader_epoch = -1;
    p.last_fetched_epoch = -1;
    p.log_start_offset = -1;
    let mut t = FetchTopic::default();
    t.topic = kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_string(
        topic.to_string(),
    ));
    t.partitions = vec![p];
    let mut request = kafka_protocol::messages::FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = 1 << 20;
    request.session_epoch = -1;
    request.topics = vec![t];
    request
}

/// CreateTopics (v7) of `topic` with one partition and `configs`; it must succeed.
pub(crate) fn create_topic(conn: &mut Conn, topic: &str, configs: &[(&str, &str)]) {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let text = |s: &str| StrBytes::from_string(s.to_string());
    let mut t = CreatableTopic::default();
    t.name = TopicName(text(topic));
    t.num_partitions = 1;
    t.replication_factor = -1;
    t.configs = configs
        .iter()
        .map(|(n, v)| {
            let mut c = CreatableTopicConfig::default();
            c.name = text(n);
            c.value = Some(text(v));
            c
        })
        .collect();
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![t];
    request.timeout_ms = 30_000;
    let response: CreateTopicsResponse =
        conn.call(kafka_protocol::messages::ApiKey::CreateTopics, 7, &request);
    assert_eq!(response.topics[0].error_code, 0, "{response:?}");
}
