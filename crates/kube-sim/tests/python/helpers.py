"""Shared by the Python client tests (each script runs with this directory on sys.path)."""
import time


def eventually(what, check, timeout=30):
    """Polls `check` until it returns something true; fails naming `what` and the last answer."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError("never %s (last: %r)" % (what, last))
