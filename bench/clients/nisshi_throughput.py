#!/usr/bin/env python3
"""Nisshi vs nisshi-diskless vs the example broker with one real client driver (issue #27).

One run, one machine, one S3 server process (`target/release/s3-server`, s3s-fs) per row, fresh
data directories per row. Each row: create the topic `bench` (8 partitions), produce N x 1 KiB
messages (confluent-kafka, idempotent, acks=all, linger 50 ms: produce_throughput.py's producer),
then consume them all with a fresh consumer group from the earliest offset. Columns: produce MB/s,
per-message produce latency p50/p99 (produce() call to delivery report), consume MB/s (first
batch to last, the first batch not counted; the group join before it is shown apart), and PUTs
per 1,000 messages while producing, split into the diskless WAL bucket and Nisshi's engine bucket.
PUTs are counted exactly with inotify: s3s-fs writes every object to a temporary file and renames
it into `<root>/<bucket>/<key>`, so every PUT (including an overwrite of the same key) is one
IN_MOVED_TO in the bucket's directory tree. Ratios are against the first row of the same run.

Rows (`--rows`, comma-separated, the first is the baseline):
  broker          the example broker (examples/kafka-broker), defaults, --storage s3://...
  diskless        nisshi-diskless --diskless-default: diskless topic, WAL on the S3 server,
                  Nisshi's engine s3:// on the same server (SQLite if that cannot start)
  classic-s3      nisshi-diskless without --diskless-default: Nisshi's own classic topic on its
                  S3 engine (tansu dynostore) on the same server
  classic-sqlite  Nisshi's own classic topic on its SQLite engine
  diskless-sqlite diskless topic, WAL on the S3 server, Nisshi's engine SQLite
  classic-pg      Nisshi's own classic topic on its PostgreSQL engine (a fresh database)
  diskless-pg     diskless topic, WAL on the S3 server, Nisshi's engine PostgreSQL
The PostgreSQL rows need Nisshi's schema, which no published crate carries:
`--nisshi-pg-schema FILE` (etc/initdb.d/010-schema.sql of Nisshi's repository at v0.6.0) and a
server at DISKLESS_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test; psql on PATH).

Usage: cargo build --release -p diskless-kafka-broker --features testkit --bin kafka-broker \\
           -p diskless-bench --bin s3-server
       (cd examples/nisshi && CARGO_TARGET_DIR=../../target cargo build --release --locked \\
           --bin nisshi-diskless)
       python3 bench/clients/nisshi_throughput.py [--messages N] [--rows broker,diskless,...]
           [--repeat R]
"""

import argparse
import ctypes
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from produce_throughput import (BROKER, PARTITIONS, ROOT, S3_SERVER, VALUE, S3Server, cpu_seconds,
                                free_port, pct, produce, producer, wait_port)

NISSHI = os.path.join(ROOT, "target", "release", "nisshi-diskless")
ENGINE_BUCKET = "nisshi-engine"

IN_MOVED_TO, IN_CREATE, IN_ISDIR, IN_Q_OVERFLOW = 0x80, 0x100, 0x40000000, 0x4000


class PutCounter:
    """Counts objects renamed into each watched bucket directory tree (one per PUT in s3s-fs)."""

    def __init__(self, buckets):
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.counts = {label: 0 for label in buckets}
        self.overflow = False
        self.dirs = {}  # watch descriptor -> (path, label)
        self.lock = threading.Lock()
        self.stopped = False
        for label, path in buckets.items():
            os.makedirs(path, exist_ok=True)
            self._watch_tree(path, label, count=False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _watch_tree(self, path, label, count):
        """Watches `path` and its subdirectories; with `count`, counts the files already there
        (renamed in before the watch existed)."""
        for d, subdirs, files in os.walk(path):
            wd = self.libc.inotify_add_watch(self.fd, d.encode(), IN_MOVED_TO | IN_CREATE)
            if wd >= 0:
                self.dirs[wd] = (d, label)
            if count:
                with self.lock:
                    self.counts[label] += sum(1 for f in files if not f.startswith("."))

    def _run(self):
        while not self.stopped:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            buf = os.read(self.fd, 1 << 20)
            i = 0
            while i < len(buf):
                wd, mask, _, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode()
                i += 16 + length
                if mask & IN_Q_OVERFLOW:
                    self.overflow = True
                    continue
                if wd not in self.dirs:
                    continue
                parent, label = self.dirs[wd]
                if mask & IN_ISDIR:
                    self._watch_tree(os.path.join(parent, name), label, count=True)
                elif mask & IN_MOVED_TO and not name.startswith("."):
                    with self.lock:
                        self.counts[label] += 1

    def snapshot(self):
        time.sleep(0.3)  # let the reader drain what is queued
        with self.lock:
            return dict(self.counts)

    def stop(self):
        self.stopped = True
        self.thread.join(timeout=5)
        os.close(self.fd)


class Server:
    """One broker process (the example broker or nisshi-diskless) with its own S3 server."""

    def __init__(self, kind, engine=None, diskless_default=False, pg_schema=None,
                 s3_latency=None):
        self.data = tempfile.mkdtemp(prefix="nisshi-throughput-")
        self.database = None
        self.log = open(os.path.join(self.data, "broker.log"), "w")
        self.s3 = S3Server(self.log, s3_latency)
        s3root = os.path.dirname(self.s3.objects)
        port = free_port()
        env = dict(os.environ)
        env.update(self.s3.env)
        env.update({"AWS_REGION": self.s3.env["AWS_DEFAULT_REGION"],
                    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "RUST_LOG": "warn"})
        buckets = {"wal": self.s3.objects}
        if kind == "broker":
            args = [BROKER, "--data-dir", self.data, "--listeners", f"127.0.0.1:{port}",
                    "--orphan-check-ms", "0", "--create-topic", f"bench:{PARTITIONS}",
                    "--storage", self.s3.url]
        else:
            bucket = os.path.basename(self.s3.objects)
            args = [NISSHI, "--data-dir", self.data,
                    "--kafka-listener-url", f"tcp://127.0.0.1:{port}",
                    "--kafka-advertised-listener-url", f"tcp://127.0.0.1:{port}",
                    "--diskless-storage", f"s3://{bucket}/objects"]
            if engine == "s3":
                # s3s-fs: a bucket is a directory under its root.
                os.makedirs(os.path.join(s3root, ENGINE_BUCKET), exist_ok=True)
                args += ["--storage-engine", f"s3://{ENGINE_BUCKET}"]
                buckets["engine"] = os.path.join(s3root, ENGINE_BUCKET)
            elif engine == "pg":
                self.database = PgDatabase(pg_schema)
                args += ["--storage-engine", self.database.url]
            if diskless_default:
                args.append("--diskless-default")
        self.puts = PutCounter(buckets)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self.bootstrap = bench_topic_ready(port, create=kind != "broker")
        except BaseException:
            self.stop(keep_log=True)
            raise

    def cpu_seconds(self):
        return cpu_seconds(self.proc.pid)

    def stop(self, keep_log=False):
        terminate(self.proc)
        self.puts.stop()
        self.s3.stop()
        self.log.close()
        if self.database is not None:
            self.database.drop()
        if keep_log:
            with open(os.path.join(self.data, "broker.log")) as f:
                tail = f.read()[-3000:]
            print(f"broker log tail ({self.data}):\n{tail}", file=sys.stderr)
        shutil.rmtree(self.data, ignore_errors=True)


def terminate(proc):
    """SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench_topic_ready(port, create):
    """Waits for a broker on `port`, creates the topic `bench` (8 partitions) when `create`,
    checks it has its partitions; returns the bootstrap address."""
    wait_port(port, timeout=60)
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if create:
        for fut in admin.create_topics([NewTopic("bench", PARTITIONS, 1)],
                                       operation_timeout=30).values():
            fut.result(timeout=60)
    topic = admin.list_topics(timeout=30).topics["bench"]
    if topic.error is not None or len(topic.partitions) != PARTITIONS:
        raise RuntimeError(f"topic bench: {topic.error}, {len(topic.partitions)} parts")
    return bootstrap


class PgDatabase:
    """A fresh database with Nisshi's PostgreSQL schema (psql), dropped by `drop`."""

    def __init__(self, schema_file, require_schema=True):
        if require_schema and not schema_file:
            raise RuntimeError("the PostgreSQL rows need --nisshi-pg-schema (see the docstring)")
        self.admin = os.environ.get("DISKLESS_POSTGRES_URL",
                                    "postgres://postgres@127.0.0.1:5432/test")
        self.name = f"nisshi_bench_{uuid.uuid4().hex}"
        plain = self.admin.split("?")[0].rsplit("/", 1)[0] + "/" + self.name
        self._psql(self.admin, "-c", f"CREATE DATABASE {self.name}")
        if schema_file:
            self._psql(plain, "-f", schema_file)
        # Nisshi's engine tries TLS first and checks the certificate against the host name; a
        # local server's certificate names "localhost", not 127.0.0.1.
        self.url = plain + "?sslmode=disable"

    @classmethod
    def empty(cls):
        """A fresh database without a schema (the diskless coordinator creates its own)."""
        return cls(None, require_schema=False)

    @staticmethod
    def _psql(url, *args):
        subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", *args], check=True,
                       stdout=subprocess.DEVNULL)

    def drop(self):
        self._psql(self.admin, "-c", f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def consume(bootstrap, expected, stall_s):
    """Consumes `expected` messages of `bench` with a fresh group from the earliest offset;
    returns (seconds to the first batch, messages read, MB/s from the first batch to the last,
    the first batch not counted)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(["bench"])
    start = time.monotonic()
    first = last = None
    n = first_n = 0
    try:
        while n < expected:
            msgs = c.consume(num_messages=1_000, timeout=1.0)
            now = time.monotonic()
            got = 0
            for m in msgs:
                if m.error() is None:
                    got += 1
            if got:
                n += got
                if first is None:
                    first, first_n = now, n
                last = now
            elif now - (last or start) > stall_s:
                break
    finally:
        c.close()
    if first is None:
        return float("nan"), n, float("nan")
    mbs = (n - first_n) * len(VALUE) / 1e6 / (last - first) if last > first else float("nan")
    return first - start, n, mbs


ROWS = {
    "broker": ("example broker, defaults, S3 (baseline)", "broker", None, False),
    "diskless": ("nisshi-diskless, diskless topic, engine s3://", "nisshi", "s3", True),
    "classic-s3": ("Nisshi classic topic, engine s3:// (dynostore)", "nisshi", "s3", False),
    "classic-sqlite": ("Nisshi classic topic, engine SQLite", "nisshi", None, False),
    "diskless-sqlite": ("nisshi-diskless, diskless topic, engine SQLite", "nisshi", None, True),
    "classic-pg": ("Nisshi classic topic, engine PostgreSQL", "nisshi", "pg", False),
    "diskless-pg": ("nisshi-diskless, diskless topic, engine PostgreSQL", "nisshi", "pg", True),
}


def run_row(name, opts):
    label, kind, engine, diskless_default = ROWS[name]
    try:
        server = Server(kind, engine, diskless_default, opts.nisshi_pg_schema, opts.s3_latency)
    except Exception as e:  # noqa: BLE001 - reported in the table
        if name == "diskless":
            print(f"(diskless with engine s3:// did not start: {e}; engine SQLite instead)",
                  file=sys.stderr)
            label, server = "nisshi-diskless, diskless topic, engine SQLite (S3 failed)", \
                Server(kind, None, True, None, opts.s3_latency)
        else:
            return label, f"did not start: {e}"
    p = None
    try:
        p = producer(server.bootstrap)
        before, cpu0 = server.puts.snapshot(), server.cpu_seconds()
        elapsed, lat = produce(p, opts.messages)
        after, cpu = server.puts.snapshot(), server.cpu_seconds() - cpu0
        p = None  # closed before the broker stops
        if len(lat) < opts.messages:
            return label, f"only {len(lat)} of {opts.messages} delivered"
        join_s, read, consume_mbs = consume(server.bootstrap, opts.messages + 1, opts.stall_s)
    except Exception as e:  # noqa: BLE001
        return label, f"failed: {e}"
    finally:
        p = None
        server.stop()
    mb = opts.messages * len(VALUE) / 1e6
    puts = {k: (after[k] - before[k]) / opts.messages * 1000 for k in after}
    return label, dict(produce=mb / elapsed, p50=pct(lat, 0.5), p99=pct(lat, 0.99),
                       consume=consume_mbs, read=read, join=join_s, puts=puts, cpu=cpu,
                       overflow=server.puts.overflow)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rows", default="broker,diskless,classic-s3",
                        help=f"comma-separated, the first is the baseline; known: {', '.join(ROWS)}")
    parser.add_argument("--stall-s", type=float, default=60.0,
                        help="give up consuming after this long without a message")
    parser.add_argument("--s3-latency",
                        help="every S3 request held for a log-normal delay: P50MS:P99MS, "
                             "`standard` (60:250) or `express` (5:20); the s3-server's --latency")
    parser.add_argument("--nisshi-pg-schema",
                        help="Nisshi's PostgreSQL schema file, for the -pg rows (see above)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of all rows, interleaved (row order within each round); "
                             "with more than one, a summary of min / median / max per row and "
                             "of each row's ratio to the baseline of the same round follows")
    opts = parser.parse_args()
    names = opts.rows.split(",")
    if unknown := [n for n in names if n not in ROWS]:
        sys.exit(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    for binary in (BROKER, S3_SERVER, NISSHI):
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing (see the usage in {__file__})")
    print(f"idempotent, acks=all, linger 50 ms, {PARTITIONS} partitions, {opts.messages} x 1 KiB "
          f"messages per row; S3 server process (s3s-fs) per row"
          f"{f', latency {opts.s3_latency}' if opts.s3_latency else ''}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| row | produce MB/s | ratio | latency p50 / p99 | consume MB/s | ratio "
          "| group join s | PUTs per 1,000 msgs (WAL + engine) | broker CPU s (produce) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rounds = []
    for _ in range(max(1, opts.repeat)):
        rounds.append(run_round(names, opts))
    if len(rounds) > 1:
        summarize(names, rounds)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def spread(values):
    """min / median / max of `values`, as text."""
    v = sorted(values)
    mid = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    return v[0], mid, v[-1]


def summarize(names, rounds):
    """Per row over the rounds: produce and consume MB/s and the ratios to the same round's
    baseline (first row), as min / median / max."""
    print()
    print(f"Summary over {len(rounds)} rounds (min / median / max; ratios to the baseline row "
          "of the same round):")
    print("| row | produce MB/s | produce ratio | consume MB/s | consume ratio | p99 ms |")
    print("|---|---|---|---|---|---|")
    for name in names:
        runs = [(rd[0], rd[1][name]) for rd in rounds if name in rd[1] and rd[0] is not None]
        if not runs:
            continue

        def fmt(key, ratio):
            vals = [(r[key] / b[key]) if ratio else r[key] for b, r in runs]
            lo, mid, hi = spread(vals)
            return f"{lo:.2f}x / {mid:.2f}x / {hi:.2f}x" if ratio else \
                f"{lo:.1f} / {mid:.1f} / {hi:.1f}"
        print(f"| {rounds[0][2][name]} | {fmt('produce', False)} | {fmt('produce', True)} "
              f"| {fmt('consume', False)} | {fmt('consume', True)} | {fmt('p99', False)} |",
              flush=True)


def run_round(names, opts):
    """One row after another; returns (baseline result, {name: result}, {name: label})."""
    base = None
    results, labels = {}, {}
    for name in names:
        label, r = run_row(name, opts)
        labels[name] = label
        if isinstance(r, str):
            print(f"| {label} | {r} | | | | | | | |", flush=True)
            continue
        base = base or r
        results[name] = r
        read = "" if r["read"] == opts.messages + 1 else f" (read {r['read'] - 1})"
        puts = " + ".join(f"{v:.2f}" for v in r["puts"].values())
        if len(r["puts"]) > 1:
            puts = f"{sum(r['puts'].values()):.2f} ({puts})"
        if r["overflow"]:
            puts += " (inotify overflow: a lower bound)"
        print(f"| {label} | {r['produce']:.1f} | {r['produce'] / base['produce']:.2f}x "
              f"| {r['p50']:.0f} ms / {r['p99']:.0f} ms | {r['consume']:.1f}{read} "
              f"| {r['consume'] / base['consume']:.2f}x | {r['join']:.1f} | {puts} "
              f"| {r['cpu']:.1f} |", flush=True)
    return base, results, labels


if __name__ == "__main__":
    main()
