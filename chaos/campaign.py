#!/usr/bin/env python3
"""A fault campaign against the example broker as users run it (issue #31, first slice).

Real processes: `s3-server` (the testkit's S3 server, s3s + s3s-fs), a fault-injecting TCP proxy
of its own between the broker and S3 (this script, asyncio), and `kafka-broker` with its embedded
SQLite coordinator and its WAL in S3 through the proxy. Real clients: idempotent confluent-kafka
(librdkafka) producers, acks=all, writing unique values to a 4-partition topic and recording every
acknowledgement (partition, offset).

Faults, drawn from `--seed` (every kind once in each six) and logged with their time:
  kill9    SIGKILL of the broker, restarted 0.2-2 s later on the same data directory
  pause    SIGSTOP of the broker for 1-6 s, then SIGCONT
  s3-cut   every open connection to S3 closed at once (requests in flight fail)
  s3-hole  S3 black-holed for 1-5 s: connections stay open, nothing is forwarded
  s3-slow  every chunk to and from S3 delayed 50-400 ms for 2-6 s
  s3-503   the proxy answers every new request 503 SlowDown for 1-4 s (without the server)

Then the faults stop, the producers flush, and a consumer reads every partition from offset 0 to
its high watermark. The checker, per partition: offsets strictly increasing and gap-free (no
transactions or deletions in this workload); every acknowledged value read exactly once, at the
offset its acknowledgement gave; no value read twice (an unacknowledged one may be read once or
not at all). Each violation is printed with the seed that replays the schedule; exit status 1.

Usage: cargo build -p diskless-kafka-broker --bin kafka-broker -p diskless-bench --bin s3-server
       python3 chaos/campaign.py [--seed N] [--seeds N] [--duration S] [--profile debug|release]
"""

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "clients"))
from produce_throughput import S3Server, free_port, wait_port  # noqa: E402  (the bench scripts' helpers)
TOPIC = "chaos"
PARTITIONS = 4
FAULTS = ("kill9", "pause", "s3-cut", "s3-hole", "s3-slow", "s3-503")


def log(t0, msg):
    print(f"[{time.time() - t0:7.2f} s] {msg}", flush=True)


class Proxy:
    """A TCP proxy in a thread of its own, with faults switched from the campaign's thread."""

    def __init__(self, target_port):
        self.target = target_port
        self.port = free_port()
        self.mode = "pass"  # pass | hole | slow | 503
        self.delay = 0.0
        self.conns = set()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.server = server
        self.ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                while self.mode == "hole":
                    await asyncio.sleep(0.05)
                if self.mode == "slow":
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _client(self, reader, writer):
        if self.mode == "503":
            await reader.read(65536)
            body = b"<Error><Code>SlowDown</Code><Message>chaos</Message></Error>"
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                         + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body)
            await writer.drain()
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self.conns.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.conns.discard(pair)

    def set(self, mode, delay=0.0):
        def apply():
            self.mode, self.delay = mode, delay
        self.loop.call_soon_threadsafe(apply)

    def cut(self):
        def apply():
            for a, b in list(self.conns):
                for w in (a, b):
                    try:
                        w.transport.abort()
                    except Exception:  # noqa: BLE001 - already gone
                        pass
            self.conns.clear()
        self.loop.call_soon_threadsafe(apply)


class Broker:
    """The example broker (default settings but its storage) restarted on one data directory."""

    def __init__(self, binary, data, s3, proxy, log_file):
        self.port = free_port()
        self.args = [binary, "--data-dir", data, "--listeners", f"127.0.0.1:{self.port}",
                     "--storage", f"s3://{s3.bucket}/wal?aws_virtual_hosted_style_request=false",
                     "--create-topic", f"{TOPIC}:{PARTITIONS}"]
        self.env = dict(os.environ)
        self.env.update(s3.env)
        self.env.update({"AWS_ENDPOINT": f"http://127.0.0.1:{proxy.port}",
                         "AWS_ALLOW_HTTP": "true", "RUST_LOG": "warn",
                         "AWS_REGION": s3.env.get("AWS_DEFAULT_REGION", "us-east-1")})
        self.log_file = log_file
        self.proc = None
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        self.log_file.write(f"--- start {self.starts}\n")
        self.log_file.flush()
        self.proc = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=self.env)
        wait_port(self.port, timeout=60.0)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Producers:
    """Idempotent producers in threads, each writing `<name>-<n>` values, round-robin partitions."""

    def __init__(self, bootstrap, count, rate, client_log):
        self.client_log = client_log
        self.acked = {}  # value -> (partition, offset)
        self.failed = {}  # value -> error name
        self.sent = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(bootstrap, i, rate), daemon=True)
                        for i in range(count)]
        for t in self.threads:
            t.start()

    def _report(self, err, msg):
        value = msg.value().decode()
        with self.lock:
            if err is not None:
                self.failed[value] = err.name()
            elif value in self.acked:
                self.failed[value] = "acknowledged twice"
            else:
                self.acked[value] = (msg.partition(), msg.offset())

    def _run(self, bootstrap, index, rate):
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 20, "message.timeout.ms": 120000,
                      "client.id": f"chaos-producer-{index}"}, logger=self.client_log)
        n = 0
        while not self.stop.is_set():
            value = f"p{index}-{n}"
            try:
                p.produce(TOPIC, value=value.encode(), partition=n % PARTITIONS,
                          on_delivery=self._report)
                n += 1
                with self.lock:
                    self.sent += 1
            except BufferError:
                p.poll(0.1)
                continue
            p.poll(0)
            time.sleep(1.0 / rate)
        left = p.flush(180)
        if left:
            with self.lock:
                self.failed[f"p{index}-flush"] = f"{left} messages not delivered at the end"

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(240)


def read_all(bootstrap, t0, client_log):
    """Every record of every partition, from offset 0 to the high watermark: {p: [(off, value)]}."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_uncommitted"}, logger=client_log)
    out = {}
    for p in range(PARTITIONS):
        _, high = c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)
        out[p] = {"high": high, "records": []}
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    deadline = time.time() + 120

    def done(v):
        return v["high"] == 0 or (v["records"] and v["records"][-1][0] >= v["high"] - 1)

    while time.time() < deadline and not all(done(v) for v in out.values()):
        m = c.poll(0.5)
        if m is None or m.error() is not None:
            continue
        out[m.partition()]["records"].append((m.offset(), m.value().decode()))
    c.close()
    log(t0, "read: " + ", ".join(f"p{p} {len(v['records'])}/{v['high']}" for p, v in out.items()))
    return out


def check(acked, read):
    """The violations of the history (a list of strings)."""
    violations = []
    seen = {}
    for p, v in read.items():
        last = -1
        for off, value in v["records"]:
            if off <= last:
                violations.append(f"p{p}: offset {off} after {last} (not increasing)")
            elif off != last + 1:
                violations.append(f"p{p}: offsets {last + 1}..{off - 1} missing (a gap)")
            last = off
            if value in seen:
                violations.append(f"duplicate: {value} at p{p}@{off} and p{seen[value][0]}@{seen[value][1]}")
            else:
                seen[value] = (p, off)
        if last != v["high"] - 1:
            violations.append(f"p{p}: read up to offset {last}, high watermark {v['high']}")
    for value, (p, off) in acked.items():
        where = seen.get(value)
        if where is None:
            violations.append(f"lost: {value} acknowledged at p{p}@{off}, never read")
        elif where != (p, off):
            violations.append(f"moved: {value} acknowledged at p{p}@{off}, read at p{where[0]}@{where[1]}")
    return violations


def campaign(seed, opts):
    rng = random.Random(seed)
    t0 = time.time()
    work = tempfile.mkdtemp(prefix=f"chaos-{seed}-")
    logs = open(os.path.join(work, "processes.log"), "w")
    target = os.path.join(ROOT, "target", opts.profile)
    s3 = S3Server(logs, binary=os.path.join(target, "s3-server"))
    proxy = Proxy(s3.port)
    broker = Broker(os.path.join(target, "kafka-broker"), os.path.join(work, "data"), s3, proxy,
                    logs)
    bootstrap = f"127.0.0.1:{broker.port}"
    log(t0, f"seed {seed}: broker on {bootstrap}, S3 through proxy {proxy.port} -> {s3.port}; "
        f"work dir {work}")
    # librdkafka's own log (connection refused while the broker is down, ...) goes to a file.
    client_log = logging.getLogger(f"chaos-clients-{seed}")
    client_log.propagate = False
    client_log.addHandler(logging.FileHandler(os.path.join(work, "clients.log")))
    producers = Producers(bootstrap, opts.producers, opts.rate, client_log)
    injected = {f: 0 for f in FAULTS}
    end = t0 + opts.duration
    # Kinds in a shuffled cycle: every kind comes once in each six faults.
    order = []
    try:
        while time.time() < end:
            time.sleep(rng.uniform(1.0, 4.0))
            if not order:
                order = list(FAULTS)
                rng.shuffle(order)
            fault = order.pop()
            injected[fault] += 1
            if fault == "kill9":
                down = rng.uniform(0.2, 2.0)
                log(t0, f"fault kill9, restart after {down:.1f} s")
                broker.kill()
                time.sleep(down)
                broker.start()
            elif fault == "pause":
                hold = rng.uniform(1.0, 6.0)
                log(t0, f"fault pause {hold:.1f} s (SIGSTOP)")
                broker.proc.send_signal(signal.SIGSTOP)
                time.sleep(hold)
                broker.proc.send_signal(signal.SIGCONT)
            elif fault == "s3-cut":
                log(t0, "fault s3-cut")
                proxy.cut()
            elif fault == "s3-hole":
                hold = rng.uniform(1.0, 5.0)
                log(t0, f"fault s3-hole {hold:.1f} s")
                proxy.set("hole")
                time.sleep(hold)
                proxy.set("pass")
            elif fault == "s3-slow":
                hold, delay = rng.uniform(2.0, 6.0), rng.uniform(0.05, 0.4)
                log(t0, f"fault s3-slow {hold:.1f} s, {delay * 1000:.0f} ms per chunk")
                proxy.set("slow", delay)
                time.sleep(hold)
                proxy.set("pass")
            else:
                hold = rng.uniform(1.0, 4.0)
                log(t0, f"fault s3-503 {hold:.1f} s")
                proxy.set("503")
                time.sleep(hold)
                proxy.set("pass")
        proxy.set("pass")
        log(t0, f"faults over; {producers.sent} sent so far; flushing the producers")
        producers.finish()
        log(t0, f"producers done: {len(producers.acked)} acknowledged, "
            f"{len(producers.failed)} failed")
        read = read_all(bootstrap, t0, client_log)
        violations = check(producers.acked, read)
        if any(k.endswith("-flush") or v == "acknowledged twice" for k, v in producers.failed.items()):
            violations += [f"producer: {k}: {v}" for k, v in producers.failed.items()
                           if k.endswith("-flush") or v == "acknowledged twice"]
    finally:
        producers.stop.set()
        broker.stop()
        s3.stop()
        logs.close()
    summary = {"seed": seed, "duration_s": round(time.time() - t0, 1),
               "faults": injected, "broker_starts": broker.starts,
               "sent": producers.sent, "acknowledged": len(producers.acked),
               "failed": len(producers.failed),
               "read": sum(len(v["records"]) for v in read.values()),
               "violations": len(violations)}
    print("SUMMARY " + json.dumps(summary), flush=True)
    for v in violations[:50]:
        print(f"VIOLATION seed={seed}: {v}", flush=True)
    if violations:
        print(f"process logs kept in {work}", flush=True)
    else:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return summary, violations


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of faults per seed")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s per producer")
    parser.add_argument("--profile", default="debug", choices=["debug", "release"])
    opts = parser.parse_args()
    failed = []
    totals = {f: 0 for f in FAULTS}
    acked = 0
    for seed in range(opts.seed, opts.seed + opts.seeds):
        summary, violations = campaign(seed, opts)
        for f, n in summary["faults"].items():
            totals[f] += n
        acked += summary["acknowledged"]
        if violations:
            failed.append(seed)
    print(f"campaign: {opts.seeds} seeds, faults {totals}, {acked} acknowledged records checked, "
          f"violations in seeds {failed or 'none'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
