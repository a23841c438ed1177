"""Two workers share a failure through a real Redis server (Hypothesis's Redis database).

Worker A finds and shrinks a failure and saves it to Redis; worker B, a fresh process that only
*replays* the database (no generation), fails at once -- and a worker on an empty Redis
database does not.  Skipped when redis-server is not installed (``.ci/run`` installs it).
"""

import contextlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("redis")
pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="Debian redis-server not installed")

WORKER = r"""
import sys
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from state_machines.profiles import load_profile
load_profile("dev")
from state_machines.databases import open_database
from state_machines.machine import machine_class
from state_machines.variants import get_variant
url, phase = sys.argv[1], sys.argv[2]
spec = get_variant("radix")
machine = machine_class(spec, spec.regimes[0], fault="R2")
phases = [Phase.reuse] if phase == "reuse" else [Phase.reuse, Phase.generate, Phase.shrink]
try:
    run_state_machine_as_test(machine, settings=settings(
        settings.default, database=open_database(url), phases=phases, max_examples=300))
except Exception as exc:
    if type(exc).__name__ != "SkipTest":  # SkipTest: nothing saved to replay
        print("FAILED", type(exc).__name__)
        sys.exit(1)
print("PASSED")
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(tmp_path):
    """A throwaway redis-server on a free loopback port (no persistence), answering pings;
    yields (its URL, a client).  The nightly's shard test shares it."""
    import redis

    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}", client
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_url(tmp_path):
    with redis_server(tmp_path) as (url, _client):
        yield url


def worker(url, phase):
    return subprocess.run([sys.executable, "-c", WORKER, url, phase], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # two fuzzing processes
def test_two_workers_share_a_failure_through_redis(redis_url):
    empty = worker(redis_url + "/1", "reuse")
    assert empty.returncode == 0 and "PASSED" in empty.stdout, empty.stderr
    a = worker(redis_url + "/0", "full")
    assert a.returncode == 1 and "FAILED" in a.stdout, a.stderr
    b = worker(redis_url + "/0", "reuse")
    assert b.returncode == 1 and "FAILED" in b.stdout, b.stderr
