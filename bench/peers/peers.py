#!/usr/bin/env python3
"""The example broker beside the peer (tansu), one real client driver, one run (issue #30).

Never run by CI: it needs the peer's binary, which this repository does not build. The peer is
found as `--peer PATH`, `$TANSU`, `tansu` on PATH, `~/.cargo/bin/tansu` or
`target/peers/bin/tansu`; `--install` builds it there first with
`cargo install tansu --version 0.6.0 --locked --features dynostore,libsql,postgres`
(0.6.0: its 0.7-0.8 releases need a newer rustc than this toolchain).

Per latency profile (`--latency none,standard,express`) one S3 server process
(`target/release/s3-server`, s3s + s3s-fs, holding every request for a log-normal delay: standard
median 60 ms / p99 250 ms, express 5 / 20 ms) serves both brokers; each broker gets a bucket of its
own, so the server's request counts (its `stats` command) split PUTs and GETs by broker. Each row
starts a fresh broker process on a fresh data directory:

  s3     ours: the example broker with default settings, `--storage s3://<bucket>/wal` (embedded
         SQLite coordinator); peer: `tansu broker --storage-engine s3://<bucket>/` (dynostore)
  files  ours: the example broker, defaults (local files + SQLite); peer: its SQLite engine
         (`sqlite://tansu.db` in its data directory). No S3: run in the `none` profile only.
  pg     ours: the example broker, S3 storage, `--coordinator postgres://...` (a fresh database);
         peer: its PostgreSQL engine (a fresh database with its schema, `--peer-pg-schema FILE`:
         etc/initdb.d/010-schema.sql of tansu's repository at v0.6.0, which no crate ships)
         Needs a PostgreSQL server at DISKLESS_POSTGRES_URL (default
         postgres://postgres@127.0.0.1:5432/test) and psql on PATH.

Workloads (`--workloads`):
  saturate  N x 1 KiB messages as fast as the client goes (confluent-kafka, idempotent,
            acks=all, linger 50 ms, 8 partitions: produce_throughput.py's producer), then all of
            them consumed by a fresh group from the earliest offset
  paced     `--paced-mbs` MB/s of 1 KiB messages for `--paced-s` seconds (latency without a
            client queue in it), s3 and pg rows only

`--sides ours3` adds the example broker in its default layout: 3 logical brokers in one process
(`--base-port`, one WAL writer each), leading the partitions in turn, so the client keeps a
connection, and 5 requests in flight, to each (PUTs per second are also given per broker). The
plain `ours` row is one listener, like the peer.

`--sides ours,nisshi,peer` adds nisshi-diskless (examples/nisshi, built with `cargo build --release
--locked --bin nisshi-diskless` there, target dir ../../target) on the s3 rows: our library inside
Nisshi, a diskless topic with its WAL in one bucket and Nisshi's engine in another (both counted).

Columns: produce MB/s, per-message latency p50 / p99 (produce() to delivery report), consume
MB/s, PUT-class requests (PUT + POST) per 1,000 messages while producing (paced: per second),
GETs per 1,000 messages while consuming, broker CPU seconds (user + system, produce and consume),
the broker's peak RSS (VmHWM). With `--repeat R` the rows run interleaved R times (ours, peer,
ours, peer, ...) and a summary gives min / median / max per row and of ours/peer per round.

Usage: cargo build --release -p diskless-kafka-broker --features testkit --bin kafka-broker \\
           -p diskless-bench --bin s3-server
       python3 bench/peers/peers.py [--install] [--messages N] [--repeat R]
           [--configs s3,files,pg] [--latency none,standard,express] [--workloads saturate,paced]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients"))

from nisshi_throughput import (NISSHI, PgDatabase, bench_topic_ready, consume,  # noqa: E402
                               terminate)
from produce_throughput import (BROKER, PARTITIONS, ROOT, S3_SERVER, VALUE, cpu_seconds,  # noqa: E402
                                free_port, pct, produce, producer)

PEER_VERSION = "0.6.0"
PEER_ROOT = os.path.join(ROOT, "target", "peers")
LATENCY = {"none": None, "standard": "standard", "express": "express"}


def find_peer(opts):
    candidates = [opts.peer, os.environ.get("TANSU"), shutil.which("tansu"),
                  os.path.expanduser("~/.cargo/bin/tansu"),
                  os.path.join(PEER_ROOT, "bin", "tansu")]
    for c in candidates:
        if c and os.path.exists(c):
            return c
    if not opts.install:
        sys.exit("the peer (tansu) is not found: give --peer PATH, or --install to build it "
                 f"into {PEER_ROOT} (about 15 minutes on 2 cores)")
    subprocess.run(["cargo", "install", "tansu", "--version", PEER_VERSION, "--locked",
                    "--features", "dynostore,libsql,postgres", "--root", PEER_ROOT], check=True)
    return os.path.join(PEER_ROOT, "bin", "tansu")


class S3Server:
    """One `s3-server` process for a latency profile; buckets are directories under its root."""

    def __init__(self, latency):
        args = [S3_SERVER] + (["--latency", latency] if latency else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        fields = dict(kv.split("=", 1) for kv in line.split())
        if "AWS_ENDPOINT" not in fields:
            raise RuntimeError(f"s3-server printed {line!r}")
        self.root = fields.pop("ROOT")
        fields.pop("BUCKET")
        self.env = fields
        self.env.update({"AWS_REGION": fields["AWS_DEFAULT_REGION"],
                         "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"})

    def bucket(self):
        name = f"b{uuid.uuid4().hex[:12]}"
        os.makedirs(os.path.join(self.root, name))
        return name

    def stats(self):
        """{bucket: {kind: count}} of the requests received so far."""
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.startswith("STATS"):
            raise RuntimeError(f"s3-server answered {line!r}")
        out = {}
        for pair in line.split()[1:]:
            key, n = pair.rsplit("=", 1)
            bucket, kind = key.rsplit("/", 1)
            out.setdefault(bucket, {})[kind] = int(n)
        return out

    def count(self, bucket, kinds):
        return sum(self.stats().get(bucket, {}).get(k, 0) for k in kinds)

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def peak_rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Broker:
    """One broker process (ours or the peer) for one row, on a fresh data directory."""

    def __init__(self, side, config, s3, opts):
        self.data = tempfile.mkdtemp(prefix="peers-")
        self.database = None
        self.bucket = s3.bucket() if s3 and config in ("s3", "pg") else None
        self.buckets = [self.bucket] if self.bucket else []
        self.log = open(os.path.join(self.data, "broker.log"), "w")
        port = free_port()
        env = dict(os.environ)
        if s3:
            env.update(s3.env)
        env["RUST_LOG"] = opts.rust_log
        self.keep = opts.keep_logs
        self.name = f"{side}-{config}"
        self.brokers = 1
        if side in ("ours", "ours3"):
            if side == "ours":
                layout = ["--listeners", f"127.0.0.1:{port}"]
            else:
                # The example broker's default layout: --brokers 3 from --base-port.
                self.brokers = 3
                port = free_ports(self.brokers)
                layout = ["--base-port", str(port)]
            args = [BROKER, "--data-dir", self.data, *layout,
                    "--create-topic", f"bench:{PARTITIONS}"]
            if self.bucket:
                args += ["--storage", f"s3://{self.bucket}/wal"]
            args += opts.ours_args.split()
            if config == "pg":
                self.database = PgDatabase.empty()
                args += ["--coordinator", self.database.url]
        elif side == "nisshi":
            # Our library inside Nisshi (examples/nisshi): a diskless topic, WAL in this
            # broker's bucket, Nisshi's own engine (metadata, groups) in a second bucket.
            engine_bucket = s3.bucket()
            self.buckets.append(engine_bucket)
            args = [NISSHI, "--data-dir", self.data,
                    "--kafka-listener-url", f"tcp://127.0.0.1:{port}",
                    "--kafka-advertised-listener-url", f"tcp://127.0.0.1:{port}",
                    "--diskless-storage", f"s3://{self.bucket}/objects",
                    "--storage-engine", f"s3://{engine_bucket}", "--diskless-default"]
        else:
            if config == "s3":
                engine = f"s3://{self.bucket}/"
            elif config == "files":
                engine = "sqlite://tansu.db"  # relative to its working directory, the data dir
            else:
                self.database = PgDatabase(opts.peer_pg_schema)
                engine = self.database.url
            args = [opts.peer_bin, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                    "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
                    "--storage-engine", engine]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=self.data)
        try:
            # Ours creates it at start (--create-topic); the others through CreateTopics.
            self.bootstrap = bench_topic_ready(port, create=side not in ("ours", "ours3"))
        except BaseException:
            self.stop(keep_log=True)
            raise

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def rss(self):
        return peak_rss_mb(self.proc.pid)

    def stop(self, keep_log=False):
        terminate(self.proc)
        self.log.close()
        if self.database is not None:
            self.database.drop()
        if self.keep:
            os.makedirs(self.keep, exist_ok=True)
            shutil.copy(os.path.join(self.data, "broker.log"),
                        os.path.join(self.keep, f"{self.name}-{uuid.uuid4().hex[:6]}.log"))
        if keep_log:
            with open(os.path.join(self.data, "broker.log")) as f:
                print(f"broker log tail ({self.data}):\n{f.read()[-3000:]}", file=sys.stderr)
        shutil.rmtree(self.data, ignore_errors=True)


PUT_KINDS, GET_KINDS = ("PUT", "POST"), ("GET",)
SIDES = ("ours", "ours3", "nisshi", "peer")


def free_ports(n):
    """The first of n consecutive ports that are free now."""
    import random
    import socket
    for _ in range(200):
        base = random.randint(20000, 60000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def run_row(side, config, workload, s3, opts):
    """One broker, one workload; returns a dict of figures or an error string."""
    try:
        broker = Broker(side, config, s3, opts)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return f"did not start: {e}"

    def requests(kinds):
        return sum(s3.count(b, kinds) for b in broker.buckets) if s3 else 0

    try:
        p = producer(broker.bootstrap)
        if workload == "paced":
            # A warm-up second: the first segment and metadata lookups are not measured.
            produce(p, int(opts.paced_mbs * 1000))
            messages = int(opts.paced_mbs * 1000 * opts.paced_s)
            rate = opts.paced_mbs * 1000
        else:
            messages, rate = opts.messages, None
        puts0, cpu0 = requests(PUT_KINDS), broker.cpu()
        elapsed, lat = produce(p, messages, rate)
        puts, cpu_p = requests(PUT_KINDS) - puts0, broker.cpu() - cpu0
        p = None
        if len(lat) < messages:
            return f"only {len(lat)} of {messages} delivered"
        out = dict(produce=messages * len(VALUE) / 1e6 / elapsed, p50=pct(lat, 0.5),
                   p99=pct(lat, 0.99), puts=puts / messages * 1000,
                   puts_s=puts / elapsed, brokers=broker.brokers, cpu_p=cpu_p)
        if workload == "saturate":
            gets0, cpu0 = requests(GET_KINDS), broker.cpu()
            # + 1: producer() sends one warm-up message first.
            _, read, mbs = consume(broker.bootstrap, messages + 1, opts.stall_s)
            out.update(consume=mbs, read=read, gets=(requests(GET_KINDS) - gets0) / messages * 1000,
                       cpu_c=broker.cpu() - cpu0)
        out["rss"] = broker.rss()
        return out
    except Exception as e:  # noqa: BLE001
        return f"failed: {e}"
    finally:
        broker.stop()


def fmt_row(r, workload):
    if isinstance(r, str):
        return r
    if workload == "paced":
        per = (f" ({r['puts_s'] / r['brokers']:.1f} per broker)" if r["brokers"] > 1 else "")
        return (f"{r['produce']:.1f} | {r['p50']:.0f} / {r['p99']:.0f} | {r['puts_s']:.1f}{per} "
                f"| {r['cpu_p']:.1f} | {r['rss']:.0f}")
    read = "" if r["read"] >= r.get("expected", r["read"]) else f" (read {r['read']})"
    return (f"{r['produce']:.1f} | {r['p50']:.0f} / {r['p99']:.0f} | {r['consume']:.1f}{read} "
            f"| {r['puts']:.2f} | {r['gets']:.2f} | {r['cpu_p']:.1f} + {r['cpu_c']:.1f} "
            f"| {r['rss']:.0f}")


HEADERS = {
    "saturate": ("| profile | config | broker | produce MB/s | p50 / p99 ms | consume MB/s "
                 "| PUTs per 1,000 msgs | GETs per 1,000 msgs | CPU s (produce + consume) "
                 "| peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|"),
    "paced": ("| profile | config | broker | produce MB/s | p50 / p99 ms | PUTs per s "
              "| CPU s | peak RSS MB |\n|---|---|---|---|---|---|---|---|"),
}


def spread(values):
    v = sorted(x for x in values if x == x)
    return (v[0], statistics.median(v), v[-1]) if v else (float("nan"),) * 3


def summarize(results, opts):
    """results: {(workload, profile, config, side): [figures per round]}"""
    print(f"\nSummary over {opts.repeat} rounds: min / median / max; ours/peer per round "
          "(produce and consume: >1 = ours faster; p99 and PUTs: <1 = ours lower)")
    print("| workload | profile | config | broker | produce MB/s | p50 ms | p99 ms | consume MB/s "
          "| PUTs (per 1,000 msgs; paced: per s) | GETs per 1,000 msgs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({k[:3] for k in results})
    for wl, prof, cfg in keys:
        rows = {side: results.get((wl, prof, cfg, side), []) for side in SIDES}
        shown = [s for s in SIDES if rows[s]]
        ratios = [f"{s}/peer" for s in shown if s != "peer" and rows["peer"]]
        for side in shown + ratios:
            cells = []
            for metric in ("produce", "p50", "p99", "consume",
                           "puts_s" if wl == "paced" else "puts", "gets"):
                if side.endswith("/peer"):
                    mine = rows[side.split("/")[0]]
                    vals = [o[metric] / q[metric] for o, q in zip(mine, rows["peer"])
                            if isinstance(o, dict) and isinstance(q, dict)
                            and metric in o and metric in q and q[metric]]
                    unit = "x"
                else:
                    vals = [r[metric] for r in rows[side] if isinstance(r, dict) and metric in r]
                    unit = ""
                if not vals:
                    cells.append("")
                    continue
                lo, mid, hi = spread(vals)
                prec = 2 if unit or metric in ("puts", "gets") else 1
                cells.append(f"{lo:.{prec}f}{unit} / {mid:.{prec}f}{unit} / {hi:.{prec}f}{unit}")
            print(f"| {wl} | {prof} | {cfg} | {side} | " + " | ".join(cells) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", help="the peer's binary (tansu)")
    parser.add_argument("--install", action="store_true",
                        help=f"cargo install tansu {PEER_VERSION} into {PEER_ROOT} if not found")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--configs", default="s3,files")
    parser.add_argument("--latency", default="none")
    parser.add_argument("--workloads", default="saturate,paced")
    parser.add_argument("--paced-mbs", type=float, default=5.0)
    parser.add_argument("--paced-s", type=float, default=30.0)
    parser.add_argument("--stall-s", type=float, default=60.0)
    parser.add_argument("--peer-pg-schema", help="tansu's PostgreSQL schema, for the pg rows")
    parser.add_argument("--sides", default="ours,peer",
                        help="ours (the example broker, one listener), ours3 (the example broker's "
                             "default layout: 3 logical brokers), nisshi (nisshi-diskless, s3 "
                             "rows only) and peer (tansu)")
    parser.add_argument("--ours-args", default="",
                        help="extra options of the example broker (figures with them are not "
                             "default-settings figures)")
    parser.add_argument("--rust-log", default="warn", help="RUST_LOG of the brokers")
    parser.add_argument("--keep-logs", help="copy each broker's log into this directory")
    opts = parser.parse_args()
    if unknown := set(opts.sides.split(",")) - set(SIDES):
        sys.exit(f"unknown sides {sorted(unknown)}; known: {', '.join(SIDES)}")
    binaries = [BROKER, S3_SERVER] + ([NISSHI] if "nisshi" in opts.sides.split(",") else [])
    for binary in binaries:
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing (see the usage in {__file__})")
    opts.peer_bin = find_peer(opts) if "peer" in opts.sides.split(",") else None
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, commit {commit}, peer tansu {PEER_VERSION} "
          f"({opts.peer_bin}); {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
          f"idempotent, acks=all, linger 50 ms, {PARTITIONS} partitions, 1 KiB messages; "
          f"saturate: {opts.messages} messages; paced: {opts.paced_mbs} MB/s for {opts.paced_s} s")
    results = {}
    for workload in opts.workloads.split(","):
        print(f"\n{workload}:\n{HEADERS[workload]}", flush=True)
        for profile in opts.latency.split(","):
            s3 = S3Server(LATENCY[profile])
            try:
                for _ in range(max(1, opts.repeat)):
                    for config in opts.configs.split(","):
                        if (config == "files" and (profile != "none" or workload == "paced")):
                            continue
                        for side in opts.sides.split(","):
                            if side == "nisshi" and config != "s3":
                                continue  # nisshi-diskless rows: S3 only
                            r = run_row(side, config, workload,
                                        s3 if config != "files" else None, opts)
                            if isinstance(r, dict) and "read" in r:
                                r["expected"] = opts.messages + 1
                            results.setdefault((workload, profile, config, side), []).append(r)
                            print(f"| {profile} | {config} | {side} | {fmt_row(r, workload)} |",
                                  flush=True)
            finally:
                s3.stop()
    if opts.repeat > 1:
        summarize(results, opts)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
