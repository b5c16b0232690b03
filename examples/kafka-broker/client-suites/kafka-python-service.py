"""Stand-in for kafka-python's test/service.py, which the sdist does not ship.

Only external mode is used (KAFKA_URI): the broker is already running, nothing is spawned.
"""


class ExternalService:
    def __init__(self, host, port):
        self.host = host
        self.port = port

    def open(self):
        pass

    def start(self):
        pass

    def stop(self):
        pass

    def close(self):
        pass

    def dump_logs(self):
        pass

    def wait_for(self, pattern, timeout=30):
        return True


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("spawning a broker is not supported here: set KAFKA_URI")
