#!/usr/bin/env python3
"""Produce throughput of a real Kafka client against the example broker (issue 17, item 1).

The workload of the issue: confluent-kafka (librdkafka), idempotent producer, acks=all, linger 50 ms,
8 partitions, N x 1 KiB messages (default 200,000). For each broker setting it starts
`target/release/kafka-broker` on a fresh data directory (local files + SQLite, with an optional
S3-like latency added to every storage call), produces, and prints one Markdown row: produce MB/s,
per-message latency p50/p99 (produce() call to delivery report), and PUTs (objects written, counted
in the data directory) per 1,000 messages and per GiB. All rows come from one run of this script;
compare them with each other (the fixed 250 ms interval is the baseline).

Usage: cargo build --release -p diskless-examples --bin kafka-broker
       python3 bench/clients/produce_throughput.py [--messages N] [--latency 100:400]
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
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKER = os.path.join(ROOT, "target", "release", "kafka-broker")
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


def count_objects(directory):
    n = 0
    for _, _, files in os.walk(directory):
        n += len(files)
    return n


def run(label, extra_args, messages, latency):
    data = tempfile.mkdtemp(prefix="diskless-throughput-")
    port = free_port()
    args = [BROKER, "--data-dir", data, "--listeners", f"127.0.0.1:{port}",
            "--orphan-check-ms", "0", "--create-topic", f"bench:{PARTITIONS}"]
    if latency:
        args += ["--storage-latency-ms", latency]
    log = open(os.path.join(data, "broker.log"), "w")
    broker = subprocess.Popen(args + extra_args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
        bootstrap = f"127.0.0.1:{port}"
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
        })
        latencies = []
        errors = []

        def delivered(err, msg, sent=None):
            if err is not None:
                errors.append(err)
            else:
                latencies.append(time.monotonic() - sent)

        # Warm up: metadata and producer id.
        producer.produce("bench", VALUE, partition=0)
        producer.flush(30)
        objects_before = count_objects(os.path.join(data, "objects"))
        start = time.monotonic()
        for i in range(messages):
            sent = time.monotonic()
            while True:
                try:
                    producer.produce("bench", VALUE, partition=i % PARTITIONS,
                                     on_delivery=lambda err, msg, sent=sent: delivered(err, msg, sent))
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        producer.flush(300)
        elapsed = time.monotonic() - start
        puts = count_objects(os.path.join(data, "objects")) - objects_before
        if errors:
            raise RuntimeError(f"{label}: {len(errors)} delivery errors, first {errors[0]}")
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        mb = messages * len(VALUE) / 1e6
        gib = messages * len(VALUE) / 2**30
        return (label, mb / elapsed, p50, p99, puts / messages * 1000, puts / gib)
    finally:
        broker.terminate()
        try:
            broker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            broker.kill()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--latency", default="100:400",
                        help="S3-like storage latency P50:P99 in ms ('' for none)")
    opts = parser.parse_args()
    if not os.path.exists(BROKER):
        sys.exit(f"{BROKER} is missing: cargo build --release -p diskless-examples --bin kafka-broker")
    settings = [
        ("fixed 250 ms interval (baseline)", ["--commit-interval-ms", "250"]),
        ("fixed 50 ms interval", ["--commit-interval-ms", "50"]),
        ("adaptive, min 50 ms, 250 ms max", ["--commit-interval-ms", "250", "--seal-min-interval-ms", "50"]),
        ("adaptive, min 20 ms, 250 ms max", ["--commit-interval-ms", "250", "--seal-min-interval-ms", "20"]),
    ]
    store = f"files + SQLite, storage latency {opts.latency} ms" if opts.latency else "files + SQLite"
    print(f"{opts.messages} x 1 KiB, idempotent, acks=all, linger 50 ms, {PARTITIONS} partitions; {store}")
    print("| setting | produce MB/s | ratio to baseline | latency p50 / p99 | PUTs per 1,000 msgs | PUTs per GiB |")
    print("|---|---|---|---|---|---|")
    base = None
    for label, extra in settings:
        row = run(label, extra, opts.messages, opts.latency)
        base = base or row[1]
        print(f"| {row[0]} | {row[1]:.1f} | {row[1] / base:.2f}x | {row[2]:.0f} ms / {row[3]:.0f} ms "
              f"| {row[4]:.2f} | {row[5]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
