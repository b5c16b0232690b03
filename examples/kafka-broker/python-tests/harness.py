"""What the client scripts of this directory share: failures, checks, logging, client settings.

The scripts run as `python3 <dir>/<script>.py`, so this module is found next to them.
"""


class Failure(Exception):
    """A check that did not hold: the script prints it and exits 1."""


def check(cond, message):
    if not cond:
        raise Failure(message)


def logger(name):
    """A `log(*args)` that prefixes every line with `[name]` and flushes (the Rust test prints the
    script's output when it fails)."""
    def log(*args):
        print(f"[{name}]", *args, flush=True)
    return log


def client_conf(bootstrap, client_id):
    """librdkafka settings every client of these scripts starts from."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "broker.address.family": "v4",
        "log_level": 4,
    }
