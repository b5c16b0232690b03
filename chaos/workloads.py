"""The campaign's clients, each in threads of its own, recording what the broker answered.

- `IdempotentProducers`: confluent-kafka (librdkafka) idempotent producers, acks=all.
- `KafkaPythonProducer`: a kafka-python producer (idempotent by default), acks=all.
- `TxProducers`: confluent-kafka transactional producers; each transaction writes to several
  partitions of two topics and is committed or aborted (drawn from the seed); its outcome is
  recorded as committed, aborted, or unknown (a commit whose answer was lost).
- `GroupConsumer`: a consumer group member that consumes the plain topic and commits offsets
  synchronously, recording each commit the broker accepted; an observer reads the group's
  committed offsets every second from another client.
- `LiveReader`: a consumer (confluent-kafka or kafka-python) reading some topics from offset 0
  while the faults run, under one isolation level, recording each record it was handed and when
  (checked against the final reads: chaos/checker.py `check_live`).
- `read_all`: every record of some topics from offset 0 to the end (partition EOF), under one
  isolation level.
"""

import os
import random
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


class IdempotentProducers:
    """Idempotent producers in threads, each writing `p<i>-<n>` values, round-robin partitions."""

    def __init__(self, bootstrap, topic, partitions, count, rate, client_log):
        self.topic, self.partitions = topic, partitions
        self.client_log = client_log
        self.acked = {}  # value -> (partition, offset)
        self.failed = {}  # value -> error name
        self.sent = 0
        self.fatal = None  # the first fatal error librdkafka reported
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

    def _error(self, err):
        if err.fatal() and self.fatal is None:
            self.fatal = f"{err.name()} {err.str()}"

    def _run(self, bootstrap, index, rate):
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                      "error_cb": self._error,
                      "linger.ms": 20, "message.timeout.ms": 120000,
                      "client.id": f"chaos-producer-{index}",
                      **({"debug": os.environ["CHAOS_RDKAFKA_DEBUG"]}
                         if os.environ.get("CHAOS_RDKAFKA_DEBUG") else {})},
                     logger=self.client_log)
        n = 0
        while not self.stop.is_set():
            value = f"p{index}-{n}"
            try:
                p.produce(self.topic, value=value.encode(), partition=n % self.partitions,
                          on_delivery=self._report)
                n += 1
                with self.lock:
                    self.sent += 1
            except BufferError:
                p.poll(0.1)
                continue
            except KafkaException as e:
                # A fatal error (the idempotent producer gave up: an epoch or sequence the
                # broker refused where Kafka would not): a violation, its reason from error_cb.
                with self.lock:
                    self.failed[f"p{index}-fatal"] = f"{e.args[0].name()}: {self.fatal}"
                break
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

    def problems(self):
        """Producer-side violations: a record acknowledged twice, or left undelivered."""
        found = [f"producer: {k}: {v}" for k, v in self.failed.items()
                 if k.endswith(("-flush", "-fatal")) or v == "acknowledged twice"]
        if self.fatal and not any(k.endswith("-fatal") for k in self.failed):
            # A fatal error while flushing at the end: its messages failed with _FATAL.
            found.append(f"producer: fatal error: {self.fatal}")
        return found


class KafkaPythonProducer:
    """One kafka-python producer writing `kp-<n>` values to the plain topic, round-robin."""

    def __init__(self, bootstrap, topic, partitions, rate):
        from kafka import KafkaProducer  # kafka-python
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                      enable_idempotence=True, linger_ms=20,
                                      delivery_timeout_ms=120000, client_id="chaos-kafka-python")
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.acked = {}
        self.failed = {}
        self.sent = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ok(self, value):
        def ok(md):
            with self.lock:
                if value in self.acked:
                    self.failed[value] = "acknowledged twice"
                else:
                    self.acked[value] = (md.partition, md.offset)
        return ok

    def _err(self, value):
        def err(e):
            with self.lock:
                self.failed[value] = type(e).__name__
        return err

    def _run(self):
        n = 0
        while not self.stop.is_set():
            value = f"kp-{n}"
            try:
                f = self.producer.send(self.topic, value=value.encode(),
                                       partition=n % self.partitions)
            except Exception as e:  # noqa: BLE001 - a buffer full or a closed producer
                with self.lock:
                    self.failed[value] = f"send: {type(e).__name__}"
                time.sleep(0.1)
                n += 1
                continue
            f.add_callback(self._ok(value))
            f.add_errback(self._err(value))
            n += 1
            with self.lock:
                self.sent += 1
            time.sleep(1.0 / self.rate)
        try:
            self.producer.flush(timeout=180)
        except Exception as e:  # noqa: BLE001
            with self.lock:
                self.failed["kp-flush"] = f"flush: {e!r}"
        self.producer.close(timeout=10)

    def finish(self):
        self.stop.set()
        self.thread.join(240)

    def problems(self):
        return [f"kafka-python producer: {k}: {v}" for k, v in self.failed.items()
                if k.endswith("-flush") or v == "acknowledged twice"]


class Unknown(Exception):
    """A commit whose outcome the producer could not learn."""


class TxProducers:
    """Transactional producers: each transaction writes 2-6 records to random partitions of the
    transactional topics, then commits (70%) or aborts, as drawn from the seed."""

    def __init__(self, bootstrap, topics, partitions, count, seed, client_log, events):
        self.bootstrap, self.topics, self.partitions = bootstrap, topics, partitions
        self.client_log, self.events = client_log, events
        self.txns = []  # {"id", "records": [(topic, p, value)], "acked": {value: (t, p, off)},
        #                  "outcome": committed | aborted | unknown | None (open)}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, seed * 100 + i), daemon=True)
                        for i in range(count)]
        for t in self.threads:
            t.start()

    def _producer(self, tid):
        """A producer for `tid`, initialized (which fences the previous one and ends its
        transaction); retried until it works or the campaign is over."""
        deadline = time.time() + 300
        while time.time() < deadline:
            p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": tid,
                          "acks": "all", "linger.ms": 10, "transaction.timeout.ms": 60000,
                          "message.timeout.ms": 60000, "client.id": tid},
                         logger=self.client_log)
            try:
                p.init_transactions(30)
                return p
            except KafkaException as e:
                self.events.append(f"{tid}: init_transactions: {e.args[0].name()}")
                time.sleep(0.5)
        raise RuntimeError(f"{tid}: init_transactions failed for 300 s")

    def _delivered(self, txn):
        def cb(err, msg):
            if err is None:
                with self.lock:
                    txn["acked"][msg.value().decode()] = (msg.topic(), msg.partition(),
                                                          msg.offset())
        return cb

    @staticmethod
    def _commit(p):
        """Commit, retrying retriable errors: committed, aborted (the commit was refused), or
        raises Unknown."""
        for _ in range(10):
            try:
                p.commit_transaction(30)
                return "committed"
            except KafkaException as e:
                err = e.args[0]
                if err.retriable():
                    continue
                if err.txn_requires_abort():
                    try:
                        p.abort_transaction(30)
                    except KafkaException:
                        pass  # refused commit: never visible; the next producer ends it
                    return "aborted"
                raise Unknown(err.name()) from e
        raise Unknown("commit retried 10 times")

    def _run(self, index, seed):
        rng = random.Random(seed)
        tid = f"chaos-tx-{index}"
        p = self._producer(tid)
        k = 0
        while not self.stop.is_set():
            txn = {"id": f"t{index}-{k}", "records": [], "acked": {}, "outcome": None,
                   "commit_at": None}
            k += 1
            with self.lock:
                self.txns.append(txn)
            commit_sent = False
            try:
                p.begin_transaction()
                for j in range(rng.randint(2, 6)):
                    topic, part = rng.choice(self.topics), rng.randrange(self.partitions)
                    value = f"{txn['id']}-{j}"
                    p.produce(topic, value=value.encode(), partition=part,
                              on_delivery=self._delivered(txn))
                    txn["records"].append((topic, part, value))
                p.poll(0)
                if rng.random() < 0.7:
                    commit_sent = True
                    # No record of the transaction may reach a read_committed reader before
                    # this moment (the commit request has not been sent yet).
                    txn["commit_at"] = time.monotonic()
                    outcome = self._commit(p)
                else:
                    p.abort_transaction(30)
                    outcome = "aborted"
            except (KafkaException, BufferError, Unknown) as e:
                name = e.args[0].name() if isinstance(e, KafkaException) else repr(e)
                # Without a commit request the transaction cannot commit: the next producer's
                # initialization aborts it.
                outcome = "unknown" if commit_sent else "aborted"
                self.events.append(f"{tid} {txn['id']}: {name}; {outcome}; new producer")
                p = self._producer(tid)
            txn["outcome"] = outcome
            p.poll(0)
            time.sleep(rng.uniform(0.05, 0.3))
        p.flush(30)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(600)


class GroupConsumer:
    """A group member consuming `topic` and committing its position synchronously every 0.5 s;
    an observer reads the committed offsets every second from a client outside the group."""

    def __init__(self, bootstrap, topic, partitions, client_log):
        self.group = f"chaos-group-{uuid.uuid4().hex[:6]}"
        self.topic, self.partitions = topic, partitions
        self.bootstrap, self.client_log = bootstrap, client_log
        self.commits = []  # (time, {p: offset}) accepted by the broker
        self.observed = []  # (time, {p: offset}) read by the observer
        self.consumed = 0
        self.errors = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._consume, daemon=True),
                        threading.Thread(target=self._observe, daemon=True)]
        for t in self.threads:
            t.start()

    def _consume(self):
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "client.id": "chaos-group-member"}, logger=self.client_log)
        c.subscribe([self.topic])
        last_commit = time.time()
        while not self.stop.is_set():
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                self.consumed += 1
            if time.time() - last_commit >= 0.5 and self.consumed:
                last_commit = time.time()
                try:
                    done = c.commit(asynchronous=False)
                except KafkaException as e:
                    name = e.args[0].name()
                    self.errors[name] = self.errors.get(name, 0) + 1
                    continue
                ok = {tp.partition: tp.offset for tp in done or []
                      if tp.error is None and tp.offset >= 0}
                if ok:
                    self.commits.append((time.time(), ok))
        c.close()

    def committed(self, consumer):
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        got = consumer.committed(tps, timeout=10)
        return {tp.partition: tp.offset for tp in got if tp.error is None and tp.offset >= 0}

    def _observe(self):
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                      "enable.auto.commit": False, "client.id": "chaos-group-observer"},
                     logger=self.client_log)
        while not self.stop.is_set():
            try:
                self.observed.append((time.time(), self.committed(c)))
            except KafkaException:
                pass
            self.stop.wait(1.0)
        c.close()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def final(self):
        """The committed offsets as a new client reads them at the end."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                      "enable.auto.commit": False}, logger=self.client_log)
        try:
            for _ in range(10):
                try:
                    return self.committed(c)
                except KafkaException:
                    time.sleep(1)
            return None
        finally:
            c.close()


class LiveReader:
    """A consumer of `topics` ({name: partitions}) from offset 0 while the campaign runs, with
    `lib` "confluent" (librdkafka) or "kafka-python", under `isolation`. Records every record it
    is handed: `seen` = [(monotonic time, topic, partition, offset, value)]. Assigned, not in a
    group: nothing may make it move backwards (no retention or deletion runs here)."""

    def __init__(self, lib, bootstrap, topics, isolation, client_log):
        self.lib, self.bootstrap, self.topics = lib, bootstrap, topics
        self.isolation, self.client_log = isolation, client_log
        self.label = f"{lib} {isolation} reader"
        self.seen = []
        self.errors = {}
        self.crashed = None  # why the reader's thread ended early, if it did
        self.stop = threading.Event()
        target = self._confluent if lib == "confluent" else self._kafka_python
        self.thread = threading.Thread(target=self._guarded, args=(target,), daemon=True)
        self.thread.start()

    def _guarded(self, target):
        try:
            target()
        except Exception as e:  # noqa: BLE001 - a reader that died sees nothing: a violation
            self.crashed = repr(e)

    def problems(self):
        return [f"{self.label}: ended early: {self.crashed}"] if self.crashed else []

    def _error(self, name):
        self.errors[name] = self.errors.get(name, 0) + 1

    def _confluent(self):
        c = Consumer({"bootstrap.servers": self.bootstrap,
                      "group.id": f"chaos-live-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "isolation.level": self.isolation, "client.id": "chaos-live-reader"},
                     logger=self.client_log)
        c.assign([TopicPartition(t, p, 0) for t, n in self.topics.items() for p in range(n)])
        while not self.stop.is_set():
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                self._error(m.error().name())
                continue
            self.seen.append((time.monotonic(), m.topic(), m.partition(), m.offset(),
                              m.value().decode()))
        c.close()

    def _kafka_python(self):
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTopicPartition
        c = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                          enable_auto_commit=False, auto_offset_reset="earliest",
                          isolation_level=self.isolation, client_id="chaos-live-kafka-python")
        tps = [KTopicPartition(t, p) for t, n in self.topics.items() for p in range(n)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        while not self.stop.is_set():
            try:
                batches = c.poll(timeout_ms=200)
            except Exception as e:  # noqa: BLE001 - the client's errors while the broker is down
                self._error(type(e).__name__)
                time.sleep(0.2)
                continue
            now = time.monotonic()
            for tp, records in batches.items():
                for r in records:
                    self.seen.append((now, tp.topic, tp.partition, r.offset, r.value.decode()))
        c.close()

    def finish(self):
        self.stop.set()
        self.thread.join(60)


def watermark(consumer, topic, p):
    """The high watermark, retrying retriable errors as a client's own requests do. A read on a
    coordinator connection that a fault broke answers KAFKA_STORAGE_ERROR, retriable in Kafka's
    protocol (KafkaStorageException is a RetriableException) though librdkafka does not flag it
    so for this call."""
    for _ in range(30):
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        except KafkaException as e:
            err = e.args[0]
            if not (err.retriable() or err.code() == KafkaError.KAFKA_STORAGE_ERROR):
                raise
            time.sleep(1)
    raise RuntimeError(f"{topic}/{p}: no high watermark after 30 tries")


def read_all(bootstrap, topics, isolation, client_log, timeout=180):
    """Every record of `topics` ({name: partitions}) from offset 0 to the end of each partition
    (the consumer's end-of-partition event: the high watermark, or the last stable offset under
    read_committed): {(topic, p): {"high": high watermark, "records": [(offset, value)]}}."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": True, "isolation.level": isolation},
                 logger=client_log)
    out = {}
    for topic, partitions in topics.items():
        for p in range(partitions):
            high = watermark(c, topic, p)
            out[(topic, p)] = {"high": high, "records": [], "eof": False}
    c.assign([TopicPartition(t, p, 0) for (t, p) in out])
    deadline = time.time() + timeout
    while time.time() < deadline and not all(v["eof"] for v in out.values()):
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() is not None:
            if m.error().code() == KafkaError._PARTITION_EOF:
                out[(m.topic(), m.partition())]["eof"] = True
            continue
        v = out[(m.topic(), m.partition())]
        v["records"].append((m.offset(), m.value().decode()))
        v["eof"] = False
    c.close()
    return out
