"""Real clients (confluent-kafka / librdkafka) against nisshi-diskless: a classic and a diskless
topic side by side — idempotent produce, consume from the start, a consumer group that commits,
and one transaction over both kinds (aborted, then committed) read with read_committed.

Usage: mixed.py BOOTSTRAP   (exits non-zero with a message on the first failed check)
"""

import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = sys.argv[1]
RUN = uuid.uuid4().hex[:8]
CLASSIC = f"classic-{RUN}"
DISKLESS = f"diskless-{RUN}"
N = 200
IDLE = 5


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def create_topics():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    futures = admin.create_topics(
        [
            NewTopic(CLASSIC, num_partitions=2, replication_factor=1),
            NewTopic(
                DISKLESS,
                num_partitions=4,
                replication_factor=1,
                config={"diskless.enable": "true"},
            ),
        ]
    )
    for name, f in futures.items():
        f.result(timeout=30)
    described = admin.describe_configs(
        [__import__("confluent_kafka.admin").admin.ConfigResource("topic", DISKLESS)]
    )
    for _, f in described.items():
        configs = f.result(timeout=30)
        check(
            configs.get("diskless.enable") is not None
            and configs["diskless.enable"].value == "true",
            "DescribeConfigs shows diskless.enable=true",
        )


def produce_idempotent(topic, partitions):
    p = Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    acked = []

    def on_delivery(err, msg):
        check(err is None, f"delivery to {topic}: {err}")
        acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    for i in range(N):
        p.produce(topic, value=f"{topic}-{i}".encode(), key=str(i).encode(), partition=i % partitions, on_delivery=on_delivery)
        p.poll(0)
    check(p.flush(60) == 0, f"flush {topic}")
    check(len(acked) == N, f"{topic}: {len(acked)} of {N} acknowledged")
    return acked


def consume(topic, partitions, group, isolation="read_uncommitted", expect=None, commit=True):
    c = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.subscribe([topic])
    got = []
    deadline = time.time() + 60
    # Without `expect`: read until nothing came for IDLE seconds (after the group's join).
    last = time.time()
    while time.time() < deadline and (expect is None or len(got) < expect):
        msg = c.poll(0.5)
        if msg is None:
            if expect is None and c.assignment() and time.time() - last > IDLE:
                break
            continue
        last = time.time()
        check(msg.error() is None, f"consume {topic}: {msg.error()}")
        got.append((msg.partition(), msg.offset(), msg.value().decode()))
    if commit and got:
        c.commit(asynchronous=False)
    c.close()
    return got


def main():
    create_topics()
    for topic, parts in ((CLASSIC, 2), (DISKLESS, 4)):
        acked = produce_idempotent(topic, parts)
        got = consume(topic, parts, f"g-{topic}", expect=N)
        check(sorted(got) == sorted(acked), f"{topic}: consumed exactly what was acknowledged")
        # The group's committed offsets: a second consumer of the group reads nothing old.
        again = consume(topic, parts, f"g-{topic}", expect=None, commit=False)
        check(again == [], f"{topic}: the group resumed after its committed offsets ({len(again)} re-read)")

    # One transaction over both kinds: aborted, then committed.
    tp = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": f"tx-{RUN}", "acks": "all"})
    tp.init_transactions(30)
    for word, commit in (("dropped", False), ("kept", True)):
        tp.begin_transaction()
        tp.produce(CLASSIC, value=f"txn-{word}".encode(), partition=0)
        tp.produce(DISKLESS, value=f"txn-{word}".encode(), partition=0)
        tp.flush(30)
        if commit:
            tp.commit_transaction(30)
        else:
            tp.abort_transaction(30)
    # The diskless topic: exactly Kafka's read_committed (the aborted batch left out).
    got = consume(DISKLESS, 1, f"rc-{DISKLESS}", isolation="read_committed", expect=None, commit=False)
    txn_values = [v for (_, _, v) in got if v.startswith("txn-")]
    check(txn_values == ["txn-kept"], f"{DISKLESS}: read_committed sees only the committed transaction, got {txn_values}")
    check(len(got) == N + 1, f"{DISKLESS}: read_committed reads {len(got)} records, not {N + 1}")
    # The classic topic is Nisshi's own: tansu 0.6.0's Fetch sends no aborted-transaction list,
    # so its read_committed consumers also see aborted records (an upstream limitation, README.md).
    # Checked here: the committed transaction reached both kinds.
    got = consume(CLASSIC, 1, f"rc-{CLASSIC}", isolation="read_committed", expect=None, commit=False)
    txn_values = [v for (_, _, v) in got if v.startswith("txn-")]
    check("txn-kept" in txn_values, f"{CLASSIC}: the committed transaction is read, got {txn_values}")
    print("ok")


if __name__ == "__main__":
    try:
        main()
    except KafkaException as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
