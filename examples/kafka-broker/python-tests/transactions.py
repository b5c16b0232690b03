#!/usr/bin/env python3
"""Transactions (KIP-98, transaction version 1) of the diskless example broker with real clients:
confluent-kafka (librdkafka) and kcat.

Scenarios (--scenario):
  commit-abort  a transactional producer writes 2 topics x 3 partitions and commits; another
                aborts; then the first commits again over the aborted records. A read_committed
                consumer sees exactly the committed records and never an aborted one, a
                read_uncommitted consumer sees both; kcat with -X isolation.level=read_committed
                and read_uncommitted prints the same counts, and never a control record as a
                message (every line printed is a value the producers sent).
  fence         two producers with one transactional.id: the second's init_transactions aborts
                the first's ongoing transaction and fences it (its commit fails with a fatal
                fenced error); the second commits; read_committed shows only the second's.
  timeout       a transaction with transaction.timeout.ms=2000 left open is aborted by the
                broker: its commit fails, read_committed never shows its records, and the
                partition's last stable offset moves past it (later records are read).
  eos-crash     consume-transform-produce with send_offsets_to_transaction from an input topic
                to an output topic; the caller SIGKILLs the broker process between the produce of
                a transaction and its commit_transaction (the script prints KILL-BROKER and waits
                for a line on stdin), restarts it, and the pipeline goes on (committing or, on an
                error, aborting and rewinding as the EOS pattern does). A second transactional id
                left open across another kill is aborted by the restarted broker's timeout
                sweeper. At the end the output holds every input record exactly once
                (read_committed) and the group's committed offsets are the input's end offsets.

Usage: transactions.py --bootstrap HOST:PORT[,...] --scenario NAME
Exit status 0 on success; a failure prints what differs and exits 1.
"""

import argparse
import shutil
import subprocess
import sys
import time

from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic
from harness import Failure, check, client_conf, logger

TIMEOUT_S = 60

log = logger("transactions")


def create_topics(bootstrap, topics):
    admin = AdminClient(client_conf(bootstrap, "txn-admin"))
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=n, replication_factor=-1) for t, n in topics],
        operation_timeout=30)
    for f in futures.values():
        f.result(timeout=TIMEOUT_S)


def txn_producer(bootstrap, tid, extra=None):
    p = Producer({**client_conf(bootstrap, f"txn-{tid}"), "transactional.id": tid,
                  **(extra or {})})
    p.init_transactions(TIMEOUT_S)
    return p


def produce_all(p, records):
    """Produces (topic, partition, value) records and waits for every delivery."""
    errors = []
    for topic, partition, value in records:
        p.produce(topic, value=value.encode(), partition=partition,
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    check(p.flush(TIMEOUT_S) == 0, "produce: messages left unflushed")
    check(not errors, f"produce errors: {errors}")


def read_all(bootstrap, partitions, isolation, expected=None, quiet_s=3.0):
    """Every value of `partitions` from the beginning with `isolation`: polls until `expected`
    values were read (then `quiet_s` more, to catch extras) or, without `expected`, until nothing
    came for `quiet_s`."""
    c = Consumer({**client_conf(bootstrap, f"reader-{isolation}"),
                  "group.id": f"reader-{isolation}-{time.time()}",
                  "enable.auto.commit": False, "isolation.level": isolation,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(t, p, 0) for t, p in partitions])
    got = []
    deadline = time.time() + TIMEOUT_S
    last = time.time()
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is None:
            done = expected is None or len(got) >= expected
            if done and time.time() - last >= quiet_s:
                break
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise Failure(f"{isolation} consumer: {m.error()}")
        got.append(m.value().decode())
        last = time.time()
    c.close()
    return got


def kcat_values(bootstrap, topic, isolation):
    """The values kcat prints for `topic` from the beginning to the end with `isolation`."""
    out = subprocess.run(
        ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
         "-X", f"isolation.level={isolation}", "-X", "broker.address.family=v4",
         "-f", "%s\\n"],
        capture_output=True, text=True, timeout=TIMEOUT_S)
    check(out.returncode == 0, f"kcat {isolation} failed: {out.stderr}")
    return [line for line in out.stdout.split("\n") if line != ""]


def commit_abort(bootstrap):
    topics = ["txn-a", "txn-b"]
    create_topics(bootstrap, [(t, 3) for t in topics])
    parts = [(t, p) for t in topics for p in range(3)]
    committer = txn_producer(bootstrap, "committer")
    aborter = txn_producer(bootstrap, "aborter")

    committer.begin_transaction()
    first = [(t, p, f"c1-{t}-{p}-{i}") for t, p in parts for i in range(20)]
    produce_all(committer, first)
    committer.commit_transaction(TIMEOUT_S)
    log("committed", len(first))

    aborter.begin_transaction()
    aborted = [(t, p, f"a-{t}-{p}-{i}") for t, p in parts for i in range(15)]
    produce_all(aborter, aborted)
    aborter.abort_transaction(TIMEOUT_S)
    log("aborted", len(aborted))

    # Interleaved: an aborted transaction open while another commits in the same partitions.
    aborter.begin_transaction()
    committer.begin_transaction()
    aborted2 = [(t, p, f"a2-{t}-{p}-{i}") for t, p in parts for i in range(5)]
    second = [(t, p, f"c2-{t}-{p}-{i}") for t, p in parts for i in range(10)]
    produce_all(aborter, aborted2)
    produce_all(committer, second)
    committer.commit_transaction(TIMEOUT_S)
    aborter.abort_transaction(TIMEOUT_S)
    committer.flush(5)
    aborter.flush(5)

    committed_values = sorted(v for _, _, v in first + second)
    aborted_values = sorted(v for _, _, v in aborted + aborted2)
    rc = read_all(bootstrap, parts, "read_committed", expected=len(committed_values))
    check(not set(rc) & set(aborted_values),
          f"read_committed saw aborted records: {sorted(set(rc) & set(aborted_values))[:5]}")
    check(sorted(rc) == committed_values,
          f"read_committed: {len(rc)} records, expected {len(committed_values)}")
    log("read_committed: exactly the committed records", len(rc))
    ru = read_all(bootstrap, parts, "read_uncommitted",
                  expected=len(committed_values) + len(aborted_values))
    check(sorted(ru) == sorted(committed_values + aborted_values),
          f"read_uncommitted: {len(ru)} records, expected "
          f"{len(committed_values) + len(aborted_values)}")
    log("read_uncommitted: committed and aborted records", len(ru))
    # Per partition order: the committed records in the order they were produced.
    for t, p in parts:
        want = [v for tt, pp, v in first + second if (tt, pp) == (t, p)]
        got = [v for v in read_all(bootstrap, [(t, p)], "read_committed", expected=len(want),
                                   quiet_s=0.5)]
        check(got == want, f"{t}-{p}: read_committed order {got[:3]}... != {want[:3]}...")

    if shutil.which("kcat"):
        sent = set(committed_values + aborted_values)
        for t in topics:
            rc = kcat_values(bootstrap, t, "read_committed")
            ru = kcat_values(bootstrap, t, "read_uncommitted")
            want_rc = [v for v in committed_values if f"-{t}-" in v]
            want_ru = [v for v in sent if f"-{t}-" in v]
            check(all(v in sent for v in rc + ru),
                  f"kcat printed something that was never sent (a control record?): "
                  f"{[v for v in rc + ru if v not in sent][:3]}")
            check(sorted(rc) == sorted(want_rc),
                  f"kcat read_committed {t}: {len(rc)} != {len(want_rc)}")
            check(sorted(ru) == sorted(want_ru),
                  f"kcat read_uncommitted {t}: {len(ru)} != {len(want_ru)}")
        log("kcat: read_committed and read_uncommitted counts as expected, no control records")
    else:
        log("kcat not installed: kcat checks not run")
    committer.flush(5)


def expect_fatal_fenced(action, what):
    try:
        action()
    except KafkaException as e:
        err = e.args[0]
        check(err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                            KafkaError.INVALID_PRODUCER_EPOCH),
              f"{what}: expected a fatal fenced error, got {err}")
        log(f"{what}: fenced as expected: {err}")
        return
    raise Failure(f"{what}: succeeded although the producer was fenced")


def fence(bootstrap):
    create_topics(bootstrap, [("txn-fence", 2)])
    parts = [("txn-fence", p) for p in range(2)]
    old = txn_producer(bootstrap, "shared-id")
    old.begin_transaction()
    produce_all(old, [(t, p, f"old-{p}-{i}") for t, p in parts for i in range(10)])
    # The second producer with the same id: its init aborts the old one's transaction.
    new = txn_producer(bootstrap, "shared-id")
    expect_fatal_fenced(lambda: old.commit_transaction(TIMEOUT_S), "the old producer's commit")
    new.begin_transaction()
    produce_all(new, [(t, p, f"new-{p}-{i}") for t, p in parts for i in range(10)])
    new.commit_transaction(TIMEOUT_S)
    rc = read_all(bootstrap, parts, "read_committed", expected=20)
    check(sorted(rc) == sorted(f"new-{p}-{i}" for p in range(2) for i in range(10)),
          f"read_committed after the fence: {sorted(rc)[:5]}... ({len(rc)})")
    ru = read_all(bootstrap, parts, "read_uncommitted", expected=40)
    check(len(ru) == 40, f"read_uncommitted: {len(ru)} records, expected 40")
    log("the older producer was fenced; only the newer one's records are committed")


def timeout(bootstrap):
    create_topics(bootstrap, [("txn-timeout", 1)])
    tp = [("txn-timeout", 0)]
    p = txn_producer(bootstrap, "slow", {"transaction.timeout.ms": 2000,
                                         "message.timeout.ms": 2000})
    p.begin_transaction()
    produce_all(p, [("txn-timeout", 0, f"late-{i}") for i in range(5)])
    log("transaction open; waiting past its timeout")
    time.sleep(6)
    try:
        p.commit_transaction(TIMEOUT_S)
        raise Failure("the commit of a timed-out transaction succeeded")
    except KafkaException as e:
        log("commit after the timeout failed as expected:", e.args[0])
    # A later transaction of another producer is readable: the aborted one no longer holds the
    # last stable offset back.
    q = txn_producer(bootstrap, "after-timeout")
    q.begin_transaction()
    produce_all(q, [("txn-timeout", 0, f"after-{i}") for i in range(3)])
    q.commit_transaction(TIMEOUT_S)
    rc = read_all(bootstrap, tp, "read_committed", expected=3)
    check(sorted(rc) == [f"after-{i}" for i in range(3)], f"read_committed: {rc}")
    log("the timed-out transaction was aborted by the broker")


def wait_restart(what):
    print("KILL-BROKER", flush=True)
    line = sys.stdin.readline()
    check(line.strip() == "RESTARTED", f"expected RESTARTED, got {line!r}")
    log("broker killed and restarted", what)


# The clients of the crash scenario keep their brokers when every broker of the cluster is down at
# once (one broker process serves them all): librdkafka's default KIP-899 rebootstrap then
# decommissions the learned brokers, and in 2.16 a broker handle with a request waiting for retry
# stays "terminating" forever, so a later request to that node (TxnOffsetCommit to the group
# coordinator) never goes out. A client-side issue, not the broker's.
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


def eos_crash(bootstrap):
    n = 120
    create_topics(bootstrap, [("eos-in", 2), ("eos-out", 2), ("eos-side", 1)])
    src = Producer({**client_conf(bootstrap, "eos-source"), "enable.idempotence": True})
    for i in range(n):
        src.produce("eos-in", value=f"in-{i}".encode(), partition=i % 2)
    check(src.flush(TIMEOUT_S) == 0, "source: unflushed")

    def consumer():
        c = Consumer({**client_conf(bootstrap, "eos-consumer"), **NO_REBOOTSTRAP, "group.id": "eos",
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest"})
        c.subscribe(["eos-in"])
        return c

    def rewind(c):
        committed = c.committed(c.assignment(), timeout=TIMEOUT_S)
        for tp in committed:
            c.seek(TopicPartition(tp.topic, tp.partition,
                                  tp.offset if tp.offset >= 0 else 0))

    c = consumer()
    p = txn_producer(bootstrap, "eos-pipeline", {"transaction.timeout.ms": 10000, **NO_REBOOTSTRAP})
    done = 0
    batches = 0
    killed = False
    deadline = time.time() + 4 * TIMEOUT_S
    while time.time() < deadline:
        msgs = c.consume(num_messages=10, timeout=1.0)
        msgs = [m for m in msgs if not m.error()]
        if not msgs:
            committed = c.committed([TopicPartition("eos-in", p_, -1) for p_ in range(2)],
                                    timeout=TIMEOUT_S)
            if sum(max(tp.offset, 0) for tp in committed) >= n:
                break
            continue
        try:
            p.begin_transaction()
            for m in msgs:
                p.produce("eos-out", value=m.value().replace(b"in-", b"out-"),
                          partition=m.partition())
            batches += 1
            if batches == 3 and not killed:
                check(p.flush(TIMEOUT_S) == 0, "unflushed before the kill")
                killed = True
                wait_restart("between produce and commit_transaction")
            p.send_offsets_to_transaction(c.position(c.assignment()),
                                          c.consumer_group_metadata(), TIMEOUT_S)
            p.commit_transaction(TIMEOUT_S)
            done += len(msgs)
        except KafkaException as e:
            err = e.args[0]
            log("transaction failed:", err)
            if err.txn_requires_abort():
                p.abort_transaction(TIMEOUT_S)
                rewind(c)
            elif err.retriable():
                rewind(c)
                try:
                    p.abort_transaction(TIMEOUT_S)
                except KafkaException:
                    pass
            else:
                # Fatal: a new producer (fences the old epoch) and a new consumer.
                c.close()
                c = consumer()
                p = txn_producer(bootstrap, "eos-pipeline", {"transaction.timeout.ms": 10000, **NO_REBOOTSTRAP})
    check(killed, "the kill never happened")
    log("pipeline done:", done, "records in committed transactions")

    # A transaction abandoned across a kill: aborted by the restarted broker's timeout sweeper.
    abandoned = txn_producer(bootstrap, "abandoned", {"transaction.timeout.ms": 3000,
                                                      "message.timeout.ms": 3000,
                                                      **NO_REBOOTSTRAP})
    abandoned.begin_transaction()
    produce_all(abandoned, [("eos-side", 0, f"abandoned-{i}") for i in range(4)])
    wait_restart("with a transaction left open")
    later = txn_producer(bootstrap, "later")
    later.begin_transaction()
    produce_all(later, [("eos-side", 0, f"later-{i}") for i in range(2)])
    later.commit_transaction(TIMEOUT_S)
    side = read_all(bootstrap, [("eos-side", 0)], "read_committed", expected=2)
    check(sorted(side) == ["later-0", "later-1"],
          f"eos-side read_committed: {side} (the abandoned transaction must be aborted)")
    log("the abandoned transaction was aborted after the restart")

    out = read_all(bootstrap, [("eos-out", 0), ("eos-out", 1)], "read_committed", expected=n)
    dups = sorted({v for v in out if out.count(v) > 1})
    check(not dups, f"output duplicated across the crash: {dups[:5]}")
    check(sorted(out) == sorted(f"out-{i}" for i in range(n)),
          f"output: {len(out)} records, expected {n}")
    committed = c.committed([TopicPartition("eos-in", p_, -1) for p_ in range(2)],
                            timeout=TIMEOUT_S)
    check([tp.offset for tp in committed] == [n // 2, n // 2],
          f"committed offsets {[tp.offset for tp in committed]} != {[n // 2, n // 2]}")
    c.close()
    log("exactly once across the crash:", len(out), "output records; offsets",
        [tp.offset for tp in committed])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--scenario", required=True,
                    choices=["commit-abort", "fence", "timeout", "eos-crash"])
    args = ap.parse_args()
    try:
        {"commit-abort": commit_abort, "fence": fence, "timeout": timeout,
         "eos-crash": eos_crash}[args.scenario](args.bootstrap)
    except Failure as e:
        log("FAILED:", e)
        sys.exit(1)
    log("ok")


if __name__ == "__main__":
    main()
