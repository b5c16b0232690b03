#!/usr/bin/env python3
"""Produce throughput of a real Kafka client against the example broker (issue 17, item 1).

The workload of the issue: confluent-kafka (librdkafka), idempotent producer, acks=all, linger 50 ms,
8 partitions, N x 1 KiB messages (default 200,000). For each broker setting it starts
`target/release/kafka-broker` on a fresh data directory (SQLite coordinator; objects in local files,
with an optional S3-like latency added to every storage call, or with `--s3` in a fresh S3 server
process, `target/release/s3-server`), produces, and prints one Markdown row: produce MB/s, per-message
latency p50/p99 (produce() call to delivery report), and PUTs (objects written, counted in the data
directory or the S3 server's bucket directory) per 1,000 messages and per GiB. All rows come from one
run of this script; compare them with each other (the first row is the baseline).

`--load` prints instead, per setting, the PUTs at idle (10 s with nothing to produce), at low and
medium load (messages at a fixed rate: 100/s and 5,000/s of 1 KiB) and at saturating load (as fast as
the client goes): PUTs per second and per GiB, and latency, which at a fixed rate has no client queue
in it.

Usage: cargo build --release -p diskless-kafka-broker --features testkit --bin kafka-broker
       cargo build --release -p diskless-bench --bin s3-server          # for --s3
       python3 bench/clients/produce_throughput.py [--messages N] [--latency 100:400] [--s3]
                                                   [--settings NAMES] [--load] [--hedge-ms MS]
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKER = os.path.join(ROOT, "target", "release", "kafka-broker")
S3_SERVER = os.path.join(ROOT, "target", "release", "s3-server")
PARTITIONS = 8
VALUE = b"x" * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"broker did not listen on {port}")


def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def count_objects(directory):
    n = 0
    for _, _, files in os.walk(directory):
        n += sum(1 for f in files if not f.startswith("."))
    return n


class S3Server:
    """A fresh `s3-server` process; stops (and removes its data) when its stdin is closed."""

    def __init__(self, log, latency=None, binary=S3_SERVER):
        """`latency`: the s3-server's `--latency` (`P50MS:P99MS`, `standard`, `express`)."""
        args = [binary] + (["--latency", latency] if latency else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True)
        line = self.proc.stdout.readline()
        fields = dict(kv.split("=", 1) for kv in line.split())
        if "AWS_ENDPOINT" not in fields:
            raise RuntimeError(f"s3-server said {line!r}")
        self.env = {k: v for k, v in fields.items() if k.startswith("AWS_")}
        self.port = int(fields["AWS_ENDPOINT"].rsplit(":", 1)[1])
        self.bucket = fields["BUCKET"]
        self.objects = os.path.join(fields["ROOT"], fields["BUCKET"])
        self.url = f"s3://{fields['BUCKET']}/objects?aws_virtual_hosted_style_request=false"

    def stop(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Broker:
    """The example broker on a fresh data directory, with one listener and the bench topic."""

    def __init__(self, extra_args, latency, s3):
        self.data = tempfile.mkdtemp(prefix="diskless-throughput-")
        self.log = open(os.path.join(self.data, "broker.log"), "w")
        self.s3 = S3Server(self.log) if s3 else None
        port = free_port()
        args = [BROKER, "--data-dir", self.data, "--listeners", f"127.0.0.1:{port}",
                "--orphan-check-ms", "0", "--create-topic", f"bench:{PARTITIONS}"]
        env = dict(os.environ)
        if latency:
            args += ["--storage-latency-ms", latency]
        if self.s3:
            args += ["--storage", self.s3.url]
            env.update(self.s3.env)
            self.objects = self.s3.objects
        else:
            self.objects = os.path.join(self.data, "objects")
        self.proc = subprocess.Popen(args + extra_args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        wait_port(port)
        self.bootstrap = f"127.0.0.1:{port}"
        AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=10)

    def puts(self):
        return count_objects(self.objects)

    def cpu_seconds(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.s3:
            self.s3.stop()
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


def producer(bootstrap):
    p = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 50,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 2_097_151,
    })
    # Warm up: metadata and producer id.
    p.produce("bench", VALUE, partition=0)
    p.flush(30)
    return p


def produce(p, messages, rate=None):
    """Produces `messages` messages (at `rate` per second, or as fast as the client accepts);
    returns (elapsed seconds, sorted latencies in seconds)."""
    latencies = []
    errors = []

    def delivered(err, sent):
        if err is not None:
            errors.append(err)
        else:
            latencies.append(time.monotonic() - sent)

    start = time.monotonic()
    for i in range(messages):
        if rate:
            due = start + i / rate
            while True:
                ahead = due - time.monotonic()
                if ahead <= 0:
                    break
                p.poll(min(ahead, 0.005))
        sent = time.monotonic()
        while True:
            try:
                p.produce("bench", VALUE, partition=i % PARTITIONS,
                          on_delivery=lambda err, msg, sent=sent: delivered(err, sent))
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(300)
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first {errors[0]}")
    latencies.sort()
    return elapsed, latencies


def pct(latencies, q):
    return latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000


def throughput_row(label, extra, opts):
    broker = Broker(extra, opts.latency, opts.s3)
    try:
        p = producer(broker.bootstrap)
        before, cpu0 = broker.puts(), broker.cpu_seconds()
        elapsed, lat = produce(p, opts.messages)
        puts = broker.puts() - before
        cpu = broker.cpu_seconds() - cpu0
    finally:
        broker.stop()
    mb = opts.messages * len(VALUE) / 1e6
    gib = opts.messages * len(VALUE) / 2**30
    return (label, mb / elapsed, pct(lat, 0.5), pct(lat, 0.99), puts / opts.messages * 1000,
            puts / gib, cpu)


def load_row(label, extra, opts):
    """Idle PUTs, then low, medium and saturating load, on one broker."""
    broker = Broker(extra, opts.latency, opts.s3)
    out = [label]
    try:
        p = producer(broker.bootstrap)
        time.sleep(1.0)  # the warm-up segment is committed
        before = broker.puts()
        time.sleep(opts.idle_s)
        out.append(broker.puts() - before)
        for rate, messages in ((100, 100 * opts.load_s), (5000, 5000 * opts.load_s),
                               (None, opts.messages)):
            before = broker.puts()
            elapsed, lat = produce(p, messages, rate)
            puts = broker.puts() - before
            gib = messages * len(VALUE) / 2**30
            out.append((puts / elapsed, puts / gib, pct(lat, 0.5), pct(lat, 0.99),
                        messages * len(VALUE) / 1e6 / elapsed))
    finally:
        broker.stop()
    return out


def settings(opts):
    adaptive = lambda ms: ["--commit-interval-ms", "250", "--seal-min-interval-ms", str(ms)]
    interval = lambda ms: ["--commit-interval-ms", str(ms), "--seal-policy", "interval"]
    hedge = ["--hedge-uploads-after-ms", str(opts.hedge_ms)]
    table = {
        "fixed250": ("fixed 250 ms interval (baseline)", interval(250)),
        "fixed50": ("fixed 50 ms interval", interval(50)),
        "adaptive250": ("adaptive, min 250 ms, 250 ms max", adaptive(250)),
        "adaptive100": ("adaptive, min 100 ms, 250 ms max", adaptive(100)),
        "adaptive50": ("adaptive, min 50 ms, 250 ms max", adaptive(50)),
        "adaptive20": ("adaptive, min 20 ms, 250 ms max", adaptive(20)),
        "default": ("the broker's default (no seal option)", []),
        "fixed250-hedged": (f"fixed 250 ms interval, hedged at {opts.hedge_ms} ms",
                            interval(250) + hedge),
        "adaptive50-hedged": (f"adaptive, min 50 ms, hedged at {opts.hedge_ms} ms",
                              adaptive(50) + hedge),
        "adaptive20-hedged": (f"adaptive, min 20 ms, hedged at {opts.hedge_ms} ms",
                              adaptive(20) + hedge),
    }
    names = opts.settings.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        sys.exit(f"unknown settings {unknown}; known: {', '.join(table)}")
    return [table[n] for n in names]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages per row (saturating load with --load)")
    parser.add_argument("--latency", default="",
                        help="S3-like storage latency P50:P99 in ms, e.g. 100:400 (default none)")
    parser.add_argument("--s3", action="store_true",
                        help="objects in a fresh s3-server process per row (S3 over HTTP)")
    parser.add_argument("--settings", default="fixed250,fixed50,adaptive50,adaptive20",
                        help="comma-separated rows, the first is the baseline")
    parser.add_argument("--hedge-ms", type=int, default=200,
                        help="--hedge-uploads-after-ms of the *-hedged settings")
    parser.add_argument("--load", action="store_true",
                        help="PUTs at idle, low, medium and saturating load instead")
    parser.add_argument("--idle-s", type=int, default=10)
    parser.add_argument("--load-s", type=int, default=10, help="seconds of low and medium load")
    opts = parser.parse_args()
    for binary, build in ((BROKER, "-p diskless-kafka-broker --features testkit --bin kafka-broker"),
                          (S3_SERVER, "-p diskless-bench --bin s3-server")):
        if (binary == BROKER or opts.s3) and not os.path.exists(binary):
            sys.exit(f"{binary} is missing: cargo build --release {build}")
    rows = settings(opts)
    store = "files" if not opts.s3 else "S3 server process (s3s-fs)"
    if opts.latency:
        store += f", storage latency {opts.latency} ms"
    print(f"idempotent, acks=all, linger 50 ms, {PARTITIONS} partitions, 1 KiB messages; "
          f"SQLite coordinator, objects in {store}; load average {os.getloadavg()[0]:.1f}")
    if opts.load:
        print(f"idle {opts.idle_s} s; low 100 msgs/s and medium 5,000 msgs/s for {opts.load_s} s "
              f"each; saturating {opts.messages} msgs as fast as the client goes")
        print("| setting | idle PUTs | low: PUTs/s, PUTs/GiB, p50 / p99 | medium: PUTs/s, PUTs/GiB, "
              "p50 / p99 | saturating: MB/s, PUTs/GiB |")
        print("|---|---|---|---|---|")
        for label, extra in rows:
            r = load_row(label, extra, opts)
            cells = [f"{x[0]:.1f}/s, {x[1]:,.0f}, {x[2]:.0f} / {x[3]:.0f} ms" for x in r[2:4]]
            print(f"| {r[0]} | {r[1]} | {cells[0]} | {cells[1]} | {r[4][4]:.1f}, {r[4][1]:,.0f} |",
                  flush=True)
        return
    print(f"{opts.messages} messages per row")
    print("| setting | produce MB/s | ratio to baseline | latency p50 / p99 | PUTs per 1,000 msgs "
          "| PUTs per GiB | broker CPU s |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for label, extra in rows:
        row = throughput_row(label, extra, opts)
        base = base or row[1]
        print(f"| {row[0]} | {row[1]:.1f} | {row[1] / base:.2f}x | {row[2]:.0f} ms / {row[3]:.0f} ms "
              f"| {row[4]:.2f} | {row[5]:.0f} | {row[6]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
