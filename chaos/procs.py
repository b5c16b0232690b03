"""The campaign's real processes and the fault injector between them (chaos/README.md).

- `Proxy`: a fault-injecting TCP proxy of its own (asyncio, in a thread) between the broker and
  S3, and between the broker and PostgreSQL: pass, cut every connection, black-hole, slow down,
  or (HTTP only) answer 503 without the server.
- `Postgres`: a private PostgreSQL server (`initdb` in the run's directory, its own port) that a
  fault can stop with `-m immediate` (a crash: no checkpoint, recovery from its WAL at the next
  start) and start again, without touching the machine's own server.
- `Broker`: the example broker with its defaults but storage, coordinator and lifecycle timings,
  restarted on one data directory after each `kill -9`.
- `NisshiCluster`: several `nisshi-diskless` nodes (examples/nisshi) sharing diskless topics
  through one PostgreSQL coordinator and one S3 bucket, each restarted on its own data directory.
"""

import asyncio
import glob
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

from produce_throughput import free_port, wait_port  # the bench scripts' helpers (sys.path)


class Proxy:
    """A TCP proxy in a thread of its own, with faults switched from the campaign's thread."""

    def __init__(self, target_port, http=False):
        self.target = target_port
        self.http = http
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
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
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
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:  # `close`: the connection ends with the proxy
            writer.close()

    async def _serve(self, reader, writer):
        if self.mode == "503" and self.http:
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

    def close(self):
        """Stops the proxy (the campaign's teardown): its listening socket and every connection
        through it closed, its loop and thread ended."""
        if not self.ready.is_set() or not self.thread.is_alive():
            return  # its server never started, or it is closed already

        async def shutdown():
            self.mode = "pass"
            self.server.close()
            # Every connection's task (each ends its connections when cancelled).
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0)  # the transports' closing callbacks

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            if not self.thread.is_alive():
                self.loop.close()


def pg_bin(name):
    """A PostgreSQL server program (Debian keeps them out of PATH), or None."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class Postgres:
    """A private PostgreSQL server in `work`/pg on a free port, trust auth, user postgres."""

    def __init__(self, work, log_file):
        self.dir = os.path.join(work, "pg")
        os.makedirs(self.dir)
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "server.log")
        self.port = free_port()
        self.as_user = []
        if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
            os.chmod(work, 0o755)  # mkdtemp's 0700 would keep that user out
            shutil.chown(self.dir, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        subprocess.run(self.as_user + [pg_bin("initdb"), "-D", self.data, "-A", "trust",
                                       "-U", "postgres"],
                       check=True, stdout=log_file, stderr=subprocess.STDOUT)
        self.restarts = 0
        try:
            self.start()
        except BaseException:
            self.stop()  # a server that came up late or half-way: the caller has no object
            raise

    @staticmethod
    def available():
        return pg_bin("initdb") is not None and pg_bin("pg_ctl") is not None

    def url(self, port=None):
        return f"postgres://postgres@127.0.0.1:{port or self.port}/postgres"

    def _ctl(self, *args):
        subprocess.run(self.as_user + [pg_bin("pg_ctl"), "-D", self.data, *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def start(self):
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._ctl("-o", opts, "-l", self.log_path, "-w", "-t", "60", "start")

    def crash(self):
        """`pg_ctl stop -m immediate`: every backend killed, no checkpoint (recovery at start)."""
        self._ctl("-m", "immediate", "-w", "stop")

    def restart(self):
        self.restarts += 1
        self.start()

    def query(self, sql):
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-At", "-c", sql], check=True, capture_output=True, text=True)
        return [line for line in out.stdout.splitlines() if line]

    def stop(self):
        try:
            self._ctl("-m", "fast", "-w", "stop")
        except subprocess.CalledProcessError:
            pass


FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))), None)


def broker_env(s3, clock_file, extra):
    """A broker process's environment: the S3 server's credentials, `extra`, and with
    `clock_file` libfaketime: the wall clock (SystemTime) offset by what the file says, re-read
    every second; the monotonic clock (Instant, tokio's timers) real."""
    env = dict(os.environ)
    env.update(s3.env)
    env.update({"AWS_ALLOW_HTTP": "true", "RUST_LOG": "warn",
                "AWS_REGION": s3.env.get("AWS_DEFAULT_REGION", "us-east-1"), **extra})
    if clock_file:
        env.update({"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": clock_file,
                    "FAKETIME_CACHE_DURATION": "1", "DONT_FAKE_MONOTONIC": "1"})
    return env


class BrokerProcess:
    """A broker process restarted on its data directory: what a fault does to it (kill, pause,
    stop) and the lifecycle counters it serves. Subclasses set `name`, `args`, `env`, `port`,
    `metrics_port`, `clock_file` and `log_file`, then call `start`."""

    name = "broker"

    def start(self):
        self.starts += 1
        self.log_file.write(f"--- {self.name} start {self.starts}\n")
        self.log_file.flush()
        self.proc = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=self.env)
        wait_port(self.port, timeout=90.0)

    def first_start(self):
        """The constructor's start: a process that does not come up (no listener in time) is
        stopped before the error propagates, as the caller has no object to stop."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def scrape(self):
        """Adds this run's `diskless_lifecycle_items_total` to `lifecycle_items` (counters start
        from zero at each start, so this is called once before each kill and at the end)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return
        for line in text.splitlines():
            m = re.match(r'diskless_lifecycle_items_total\{.*worker="(\w+)".*\} (\d+)', line)
            if m:
                self.lifecycle_items[m[1]] = self.lifecycle_items.get(m[1], 0) + int(m[2])

    def kill(self):
        self.scrape()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self, seconds):
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.scrape()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Broker(BrokerProcess):
    """The example broker (default settings but storage, coordinator and lifecycle timings)
    restarted on one data directory."""

    name = "kafka-broker"

    def __init__(self, binary, data, s3, s3_proxy, topics, log_file, coordinator=None,
                 lifecycle=(), clock_file=None):
        self.port = free_port()
        self.metrics_port = free_port()
        self.data = data
        self.lifecycle_items = {}  # worker -> items removed, summed over the broker's runs
        self.args = [binary, "--data-dir", data, "--listeners", f"127.0.0.1:{self.port}",
                     "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
                     "--storage", f"s3://{s3.bucket}/wal?aws_virtual_hosted_style_request=false",
                     *lifecycle]
        if coordinator:
            self.args += ["--coordinator", coordinator]
        for name, partitions in topics:
            self.args += ["--create-topic", f"{name}:{partitions}"]
        self.env = broker_env(s3, clock_file,
                              {"AWS_ENDPOINT": f"http://127.0.0.1:{s3_proxy.port}"})
        self.clock_file = clock_file
        self.log_file = log_file
        self.proc = None
        self.starts = 0
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.first_start()

    def pick(self, rng):
        """The process a kill, pause or clock step hits: the one broker."""
        return self


class SmallDisk:
    """The broker's data directory on a tmpfs of its own, so that a fault can fill it (ENOSPC for
    SQLite's files) and free it again. Needs the right to mount (root); else `ok` is False."""

    def __init__(self, path, size="1g"):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.ok = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        self.ballast = os.path.join(path, "chaos-ballast")

    def fill(self):
        """Takes every free byte: the next write of the broker's files fails with ENOSPC."""
        st = os.statvfs(self.path)
        try:
            # Unbuffered: closing must not flush a chunk the full disk refuses (an ENOSPC
            # raised by the `with` block's close).
            f = open(self.ballast, "wb", buffering=0)
        except OSError:  # already full: the fault is in effect as it is
            return
        with f:
            try:
                os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize)
            except OSError:
                pass
            chunk = b"\0" * 65536
            try:
                while f.write(chunk):  # whatever allocation rounding left
                    pass
            except OSError:
                pass

    def free(self):
        try:
            os.unlink(self.ballast)
        except FileNotFoundError:
            pass

    def release(self, keep_copy=None):
        """Unmounts, first copying the data to `keep_copy` when given (a failed run's evidence)."""
        if not self.ok:
            return
        self.free()
        if keep_copy:
            shutil.copytree(self.path, keep_copy, dirs_exist_ok=True)
        subprocess.run(["umount", "-l", self.path], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


class NisshiNode(BrokerProcess):
    """One `nisshi-diskless` process (examples/nisshi), restarted on its data directory: Nisshi's
    own engine in a bucket of the S3 server (reached directly), the WAL through the S3 proxy
    (`aws_endpoint` in the storage URL), the coordinator through the PostgreSQL proxy."""

    def __init__(self, binary, node_id, data, s3, s3_proxy, coordinator, log_file, lifecycle=(),
                 clock_file=None):
        self.port = free_port()
        self.metrics_port = free_port()
        self.node_id = node_id
        self.name = f"nisshi-diskless {node_id}"
        self.data = data
        os.makedirs(data, exist_ok=True)
        self.lifecycle_items = {}
        storage = (f"s3://{s3.bucket}/wal?aws_virtual_hosted_style_request=false"
                   f"&aws_allow_http=true&aws_endpoint=http://127.0.0.1:{s3_proxy.port}")
        listener = f"tcp://127.0.0.1:{self.port}"
        self.args = [binary, "--kafka-node-id", str(node_id), "--kafka-listener-url", listener,
                     "--kafka-advertised-listener-url", listener, "--data-dir", data,
                     "--storage-engine", f"s3://{NISSHI_ENGINE_BUCKET}",
                     "--diskless-storage", storage, "--diskless-coordinator", coordinator,
                     "--diskless-default", "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
                     *lifecycle]
        self.env = broker_env(s3, clock_file, {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"})
        self.clock_file = clock_file
        self.log_file = log_file
        self.proc = None
        self.starts = 0
        self.first_start()


NISSHI_ENGINE_BUCKET = "nisshi-engine"


class NisshiCluster:
    """`count` nisshi-diskless nodes sharing diskless topics (one coordinator, one WAL bucket,
    one Nisshi engine bucket); each fault that hits a process hits one node drawn from the seed.
    Each node has its own clock file, so a clock step makes the nodes' clocks disagree."""

    def __init__(self, binary, count, work, s3, s3_proxy, coordinator, log_file, lifecycle=(),
                 clock_files=None):
        os.makedirs(os.path.join(os.path.dirname(s3.objects), NISSHI_ENGINE_BUCKET),
                    exist_ok=True)
        self.nodes = []
        try:
            for i in range(count):
                self.nodes.append(NisshiNode(binary, i + 1, os.path.join(work, f"node-{i + 1}"),
                                             s3, s3_proxy, coordinator, log_file, lifecycle,
                                             clock_files[i] if clock_files else None))
        except BaseException:
            self.stop()  # the nodes already up: the caller has no cluster to stop
            raise
        self.bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def pick(self, rng):
        return rng.choice(self.nodes)

    @property
    def starts(self):
        return sum(n.starts for n in self.nodes)

    @property
    def lifecycle_items(self):
        total = {}
        for n in self.nodes:
            for k, v in n.lifecycle_items.items():
                total[k] = total.get(k, 0) + v
        return total

    def stop(self):
        for n in self.nodes:
            n.stop()
