#!/usr/bin/env python3
"""A fault campaign against the brokers as users run them (issue #31; chaos/README.md).

Real processes: `s3-server` (the testkit's S3 server, s3s + s3s-fs), a fault-injecting TCP proxy
of its own between the brokers and S3 (and between the brokers and PostgreSQL), a private
PostgreSQL server when the seed's coordinator is PostgreSQL, and the brokers, one setup per seed:
  sqlite    `kafka-broker` (the example broker) with its default settings but its storage (S3
            through the proxy), its coordinator (SQLite) and its lifecycle timings (orphan
            collection and the cleaner every second, so that their work is checked too)
  postgres  the same on the PostgreSQL coordinator (through its proxy)
  nisshi    three `nisshi-diskless` nodes (examples/nisshi) sharing the diskless topics: one
            PostgreSQL coordinator (through the proxy), one WAL bucket (through the S3 proxy),
            Nisshi's own engine in another bucket of the same server (directly), the same
            lifecycle timings

Real clients (chaos/workloads.py): idempotent confluent-kafka (librdkafka) producers and a
kafka-python producer on a plain 4-partition topic; transactional confluent-kafka producers
writing to two 2-partition topics, committing or aborting; a consumer group member committing
offsets, and an observer reading them; readers during the faults: confluent-kafka and kafka-python
under read_committed on the transactional topics, kafka-python under read_uncommitted on the
plain topic.

Faults, drawn from `--seed` (every kind once in each cycle) and logged with their time; a kill,
pause or clock step hits one broker process (with Nisshi, a node drawn from the seed):
  kill9       SIGKILL of the broker, restarted 0.2-2 s later on the same data directory
  pause       SIGSTOP of the broker for 1-6 s, then SIGCONT
  s3-cut      every open connection to S3 closed at once (requests in flight fail)
  s3-hole     S3 black-holed for 1-5 s: connections stay open, nothing is forwarded
  s3-slow     every chunk to and from S3 delayed 50-400 ms for 2-6 s
  s3-503      the proxy answers every new request 503 SlowDown for 1-4 s (without the server)
and with the PostgreSQL coordinator:
  pg-cut      every connection to PostgreSQL closed at once
  pg-hole     PostgreSQL black-holed for 1-5 s
  pg-slow     every chunk to and from PostgreSQL delayed 20-200 ms for 2-6 s
  pg-restart  PostgreSQL crashed (`pg_ctl stop -m immediate`) and started 0.5-3 s later
and with libfaketime (Debian's libfaketime):
  clock-step  the broker's wall clock set 5-30 s ahead of or behind real time (it stays so
              until the next step; the monotonic clock is left alone; each Nisshi node has its
              own, so their clocks disagree)
and where a tmpfs can be mounted (root) for the example broker's data directory:
  disk-full   that filesystem filled for 1-4 s (SQLite's writes fail with ENOSPC), then freed

Then the faults stop, the clients finish, everything is read back under read_uncommitted and
read_committed, the lifecycle workers get time to collect orphans, and the checker
(chaos/checker.py) looks at the whole history. Each violation is printed with the seed that
replays the schedule; the exit status is 1.

Usage: cargo build -p diskless-kafka-broker --bin kafka-broker -p diskless-bench --bin s3-server
       cargo build --manifest-path examples/nisshi/Cargo.toml --bin nisshi-diskless  # nisshi seeds
       python3 chaos/campaign.py [--seed N] [--seeds N] [--duration S]
                                 [--setups sqlite,postgres,nisshi] [--profile debug|release]
"""

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "clients"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_throughput import S3Server  # noqa: E402  (the bench scripts' S3 server launcher)
from checker import check_group, check_leaks, check_live, check_plain, check_txns  # noqa: E402
from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from procs import FAKETIME, Broker, NisshiCluster, Postgres, Proxy, SmallDisk  # noqa: E402
from workloads import (GroupConsumer, IdempotentProducers, KafkaPythonProducer,  # noqa: E402
                       LiveReader, TxProducers, read_all)

TOPIC = "chaos"
PARTITIONS = 4
TX_TOPICS = ("chaos-tx-a", "chaos-tx-b")
TX_PARTITIONS = 2
S3_FAULTS = ("kill9", "pause", "s3-cut", "s3-hole", "s3-slow", "s3-503")
CLOCK_FAULTS = ("clock-step",)
DISK_FAULTS = ("disk-full",)
PG_FAULTS = ("pg-cut", "pg-hole", "pg-slow", "pg-restart")
# Orphan collection and the cleaner every second with short ages, so that the leak check at the
# end sees their work, and so that they run while the faults do. A minimum age below the commit
# deadline lets the collector fence an upload whose commit is merely slow: that produce request
# fails and is retried, which the checker's "nothing lost, nothing twice" covers.
LIFECYCLE = ["--retention-check-ms", "1000", "--orphan-check-ms", "1000",
             "--orphan-min-age-ms", "3000", "--orphan-recheck-ms", "1000",
             "--cleaner-grace-ms", "1000"]
# The Nisshi setup: nodes sharing the diskless topics, with the same lifecycle timings
# (examples/nisshi's options for them).
NISSHI_NODES = 3
NISSHI_LIFECYCLE = ["--diskless-lifecycle-check-ms", "1000", "--diskless-orphan-min-age-ms",
                    "3000", "--diskless-orphan-recheck-ms", "1000",
                    "--diskless-cleaner-grace-ms", "1000"]
WAL_PREFIX = "wal"  # the storage URL's path: the broker's keys are relative to it


class NoDisk:
    """No data directory of its own to fill (the Nisshi setup)."""
    ok = False

    def release(self, keep_copy=None):
        pass


def log(t0, msg):
    print(f"[{time.time() - t0:7.2f} s] {msg}", flush=True)


def stored_keys(s3):
    """The object keys in the bucket, relative to the broker's storage root."""
    root = os.path.join(s3.objects, WAL_PREFIX)
    keys = []
    for d, _, files in os.walk(root):
        for f in files:
            keys.append(os.path.relpath(os.path.join(d, f), root))
    return keys


def known_objects(broker, pg):
    """{object key: live bytes} of every object row of the coordinator."""
    sql = "SELECT object_key, live_bytes FROM objects"
    if pg is None:
        db = os.path.join(broker.data, "coordinator.db")
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return dict(conn.execute(sql).fetchall())
    rows = pg.query("SELECT object_key || '|' || live_bytes FROM diskless.objects")
    return {k: int(v) for k, v in (row.rsplit("|", 1) for row in rows)}


def inject(fault, rng, t0, broker, s3_proxy, pg, pg_proxy, disk):
    """Injects `fault`; a kill, pause or clock step hits the process `broker.pick` draws (the
    example broker, or one of the Nisshi nodes)."""
    target = broker.pick(rng) if fault in ("kill9", "pause", "clock-step") else None
    on = f" on node {target.node_id}" if hasattr(target, "node_id") else ""
    if fault == "disk-full":
        hold = rng.uniform(1.0, 4.0)
        log(t0, f"fault disk-full {hold:.1f} s (the data directory's filesystem)")
        disk.fill()
        time.sleep(hold)
        disk.free()
    elif fault == "clock-step":
        offset = rng.choice((-1, 1)) * rng.uniform(5.0, 30.0)
        log(t0, f"fault clock-step{on}: the wall clock now {offset:+.1f} s from real time")
        with open(target.clock_file, "w") as f:
            f.write(f"{offset:+.1f}s\n")
    elif fault == "kill9":
        down = rng.uniform(0.2, 2.0)
        log(t0, f"fault kill9{on}, restart after {down:.1f} s")
        target.kill()
        time.sleep(down)
        target.start()
    elif fault == "pause":
        hold = rng.uniform(1.0, 6.0)
        log(t0, f"fault pause{on} {hold:.1f} s (SIGSTOP)")
        target.pause(hold)
    elif fault == "pg-restart":
        down = rng.uniform(0.5, 3.0)
        log(t0, f"fault pg-restart: crash, start after {down:.1f} s")
        pg.crash()
        time.sleep(down)
        pg.restart()
    else:
        proxy = s3_proxy if fault.startswith("s3") else pg_proxy
        kind = fault.split("-", 1)[1]
        if kind == "cut":
            log(t0, f"fault {fault}")
            proxy.cut()
            return
        hold = rng.uniform(2.0, 6.0) if kind == "slow" else rng.uniform(1.0, 5.0 if kind == "hole" else 4.0)
        delay = 0.0
        if kind == "slow":
            delay = rng.uniform(0.05, 0.4) if fault.startswith("s3") else rng.uniform(0.02, 0.2)
        log(t0, f"fault {fault} {hold:.1f} s" + (f", {delay * 1000:.0f} ms per chunk" if delay else ""))
        proxy.set({"hole": "hole", "slow": "slow", "503": "503"}[kind], delay)
        time.sleep(hold)
        proxy.set("pass")


def clock_file_in(work, name):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write("+0s\n")
    return path


def create_topics(bootstrap, topics):
    """Creates `topics` [(name, partitions)] through the Admin API (Nisshi's nodes: diskless by
    `--diskless-default`), retrying while the nodes settle."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.time() + 60
    while True:
        futures = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1)
                                       for t, n in topics])
        errors = []
        for topic, f in futures.items():
            try:
                f.result(timeout=30)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    errors.append(f"{topic}: {e.args[0].name()}")
        if not errors:
            return
        if time.time() > deadline:
            raise RuntimeError(f"topics not created: {errors}")
        time.sleep(1)


def campaign(seed, setup, opts):
    """One seed's run. `setup`: `sqlite` or `postgres` (the example broker on that coordinator),
    or `nisshi` (NISSHI_NODES nisshi-diskless nodes on PostgreSQL and S3)."""
    rng = random.Random(seed)
    t0 = time.time()
    work = tempfile.mkdtemp(prefix=f"chaos-{seed}-")
    violations = []
    summary = {"seed": seed, "setup": setup}
    # Each process, server, proxy, mount and client started is registered for teardown right
    # after its start: whatever raises, during setup or the run, stops everything started so far
    # (in reverse order). The work dir stays but for a run without violations (below).
    with contextlib.ExitStack() as stack:
        logs = stack.enter_context(open(os.path.join(work, "processes.log"), "w"))
        target = os.path.join(ROOT, "target", opts.profile)
        s3 = S3Server(logs, binary=os.path.join(target, "s3-server"))
        stack.callback(s3.stop)
        s3_proxy = Proxy(s3.port, http=True)
        stack.callback(s3_proxy.close)
        pg = pg_proxy = None
        faults = S3_FAULTS
        coordinator_url = None
        if setup in ("postgres", "nisshi"):
            pg = Postgres(work, logs)
            stack.callback(pg.stop)
            pg_proxy = Proxy(pg.port)
            stack.callback(pg_proxy.close)
            coordinator_url = pg.url(pg_proxy.port)
            faults = S3_FAULTS + PG_FAULTS
        if FAKETIME:
            faults = faults + CLOCK_FAULTS
        topics = [(TOPIC, PARTITIONS)] + [(t, TX_PARTITIONS) for t in TX_TOPICS]
        disk = NoDisk()
        if setup == "nisshi":
            # The Nisshi nodes keep nothing of the diskless path on local disk (coordinator in
            # PostgreSQL, WAL and Nisshi's engine in S3): no disk-full fault.
            binary = os.environ.get("NISSHI_BIN") or os.path.join(target, "nisshi-diskless")
            clocks = ([clock_file_in(work, f"clock-offset-{i + 1}")
                       for i in range(NISSHI_NODES)] if FAKETIME else None)
            broker = NisshiCluster(binary, NISSHI_NODES, work, s3, s3_proxy, coordinator_url,
                                   logs, lifecycle=NISSHI_LIFECYCLE, clock_files=clocks)
            stack.callback(broker.stop)
            create_topics(broker.bootstrap, topics)
        else:
            disk = SmallDisk(os.path.join(work, "data"))
            # Unmounted after the broker stopped; a failed run's data copied first (evidence).
            stack.callback(lambda: disk.release(
                keep_copy=os.path.join(work, "data-copy") if violations else None))
            if disk.ok:
                faults = faults + DISK_FAULTS
            else:
                log(t0, "skipped: disk-full faults (cannot mount a tmpfs for the data directory)")
            broker = Broker(os.path.join(target, "kafka-broker"), os.path.join(work, "data"),
                            s3, s3_proxy, topics, logs, coordinator=coordinator_url,
                            lifecycle=LIFECYCLE,
                            clock_file=clock_file_in(work, "clock-offset") if FAKETIME else None)
            stack.callback(broker.stop)
        bootstrap = broker.bootstrap
        log(t0, f"seed {seed}: {setup}: brokers on {bootstrap}, S3 through proxy "
            f"{s3_proxy.port} -> {s3.port}; work dir {work}")
        # The clients' own logs (connection refused while the broker is down, ...) go to a file.
        client_log = logging.getLogger(f"chaos-clients-{seed}")
        client_log.propagate = False
        client_log.setLevel(logging.DEBUG)  # librdkafka logs at debug level only with its `debug`
        client_log.addHandler(logging.FileHandler(os.path.join(work, "clients.log")))
        events = []
        producers = IdempotentProducers(bootstrap, TOPIC, PARTITIONS, opts.producers, opts.rate,
                                        client_log)
        stack.callback(producers.stop.set)
        kp = KafkaPythonProducer(bootstrap, TOPIC, PARTITIONS, opts.rate / 2)
        stack.callback(kp.stop.set)
        tx = TxProducers(bootstrap, TX_TOPICS, TX_PARTITIONS, opts.tx_producers, seed, client_log,
                         events)
        stack.callback(tx.stop.set)
        group = GroupConsumer(bootstrap, TOPIC, PARTITIONS, client_log)
        stack.callback(group.stop.set)
        tx_topics = {t: TX_PARTITIONS for t in TX_TOPICS}
        readers = []
        for lib, topics_of, isolation in (("confluent", tx_topics, "read_committed"),
                                          ("kafka-python", tx_topics, "read_committed"),
                                          ("kafka-python", {TOPIC: PARTITIONS},
                                           "read_uncommitted")):
            readers.append(LiveReader(lib, bootstrap, topics_of, isolation, client_log))
            stack.callback(readers[-1].stop.set)
        injected = {f: 0 for f in faults}
        end = t0 + opts.duration
        order = []  # kinds in a shuffled cycle: every kind once in each cycle
        while time.time() < end:
            time.sleep(rng.uniform(1.0, 4.0))
            if not order:
                order = list(faults)
                rng.shuffle(order)
            fault = order.pop()
            injected[fault] += 1
            inject(fault, rng, t0, broker, s3_proxy, pg, pg_proxy, disk)
        s3_proxy.set("pass")
        if pg_proxy:
            pg_proxy.set("pass")
        log(t0, f"faults over; {producers.sent + kp.sent} sent so far; {len(tx.txns)} "
            f"transactions begun; finishing the clients")
        producers.finish()
        kp.finish()
        tx.finish()
        group.finish()
        for r in readers:
            r.finish()
        acked = dict(producers.acked)
        acked.update(kp.acked)
        outcomes = {}
        for t in tx.txns:
            outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
        log(t0, f"clients done: {len(producers.acked)} + {len(kp.acked)} (kafka-python) "
            f"acknowledged, {len(producers.failed) + len(kp.failed)} failed; transactions "
            f"{outcomes}; {len(group.commits)} group commits accepted")
        for e in events[:20]:
            log(t0, f"client event: {e}")

        plain = read_all(bootstrap, {TOPIC: PARTITIONS}, "read_uncommitted", client_log)
        txr = {t: TX_PARTITIONS for t in TX_TOPICS}
        uncommitted = read_all(bootstrap, txr, "read_uncommitted", client_log)
        committed = read_all(bootstrap, txr, "read_committed", client_log)
        final = group.final()
        log(t0, "read: " + ", ".join(f"{t}/{p} {len(v['records'])}/{v['high']}"
                                     for (t, p), v in {**plain, **uncommitted}.items())
            + f"; read_committed {sum(len(v['records']) for v in committed.values())}")
        violations += check_plain(acked, plain)
        violations += producers.problems() + kp.problems()
        violations += check_txns(tx.txns, uncommitted, committed)
        violations += check_group(group.commits, group.observed, final)
        for r in readers:
            violations += r.problems()
            plain_reader = r.isolation == "read_uncommitted"
            violations += check_live(r.label, r.seen, plain if plain_reader else committed,
                                     gap_free=plain_reader, txns=None if plain_reader else tx.txns)
        log(t0, "live readers: " + ", ".join(f"{r.label} {len(r.seen)} records"
                                             + (f" (errors {r.errors})" if r.errors else "")
                                             for r in readers))

        # The lifecycle workers' turn: what was uploaded but never committed (kill -9, a lost
        # commit answer, a fenced upload) must be collected; nothing live may go.
        deadline = time.time() + opts.lifecycle_wait
        while time.time() < deadline:
            if set(stored_keys(s3)) <= set(known_objects(broker, pg)):
                break
            time.sleep(1)
        broker.stop()
        stored, known = stored_keys(s3), known_objects(broker, pg)
        live = [k for k, b in known.items() if b > 0]
        log(t0, f"lifecycle: {len(stored)} objects in storage, {len(known)} known to the "
            f"coordinator ({len(live)} live)")
        violations += check_leaks(stored, known, live)
        summary.update({
            "faults": injected, "broker_starts": broker.starts,
            "pg_restarts": pg.restarts if pg else 0,
            "acknowledged": len(acked), "transactions": outcomes,
            "tx_records_committed": sum(len(v["records"]) for v in committed.values()),
            "group_commits": len(group.commits), "objects": len(stored),
            "live_seen": {r.label: len(r.seen) for r in readers},
            "lifecycle_items": broker.lifecycle_items,
            "read": sum(len(v["records"]) for v in plain.values())})
    summary["duration_s"] = round(time.time() - t0, 1)
    summary["violations"] = len(violations)
    print("SUMMARY " + json.dumps(summary), flush=True)
    for v in violations[:50]:
        print(f"VIOLATION seed={seed}: {v}", flush=True)
    if violations:
        print(f"process logs kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return summary, violations


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of faults per seed")
    parser.add_argument("--setups", "--coordinators", default="sqlite,postgres,nisshi",
                        help="the seeds' setups in turn: sqlite or postgres (the example broker "
                             "on that coordinator), nisshi (nisshi-diskless nodes on PostgreSQL)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--tx-producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s per producer")
    parser.add_argument("--lifecycle-wait", type=float, default=60.0,
                        help="seconds the orphan collector gets at the end")
    parser.add_argument("--profile", default="debug", choices=["debug", "release"])
    opts = parser.parse_args()
    kinds = opts.setups.split(",")
    if FAKETIME is None:
        if os.environ.get("DISKLESS_REQUIRE_FAKETIME") == "1":
            sys.exit("libfaketime not found and DISKLESS_REQUIRE_FAKETIME=1")
        print("skipped: clock-step faults (no libfaketime: apt-get install libfaketime)",
              flush=True)
    if {"postgres", "nisshi"} & set(kinds) and not Postgres.available():
        if os.environ.get("DISKLESS_REQUIRE_POSTGRES") == "1":
            sys.exit("PostgreSQL's initdb/pg_ctl not found and DISKLESS_REQUIRE_POSTGRES=1")
        print("skipped: PostgreSQL and Nisshi seeds (no initdb/pg_ctl on this machine)",
              flush=True)
        kinds = [k for k in kinds if k not in ("postgres", "nisshi")] or ["sqlite"]
    nisshi = os.environ.get("NISSHI_BIN") or os.path.join(ROOT, "target", opts.profile,
                                                          "nisshi-diskless")
    if "nisshi" in kinds and not os.path.exists(nisshi):
        if os.environ.get("CHAOS_REQUIRE_NISSHI") == "1":
            sys.exit(f"{nisshi} not found and CHAOS_REQUIRE_NISSHI=1")
        print(f"skipped: Nisshi seeds ({nisshi} not built: cargo build --manifest-path "
              f"examples/nisshi/Cargo.toml --bin nisshi-diskless)", flush=True)
        kinds = [k for k in kinds if k != "nisshi"] or ["sqlite"]
    failed = []
    totals = {}
    acked = 0
    for i, seed in enumerate(range(opts.seed, opts.seed + opts.seeds)):
        summary, violations = campaign(seed, kinds[i % len(kinds)], opts)
        for f, n in summary.get("faults", {}).items():
            totals[f] = totals.get(f, 0) + n
        acked += summary.get("acknowledged", 0)
        if violations:
            failed.append(seed)
    print(f"campaign: {opts.seeds} seeds, faults {totals}, {acked} acknowledged records checked, "
          f"violations in seeds {failed or 'none'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
