"""The embedded SeaweedFS: loopback only, generated credentials, clean stop, `speedforge s3 serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from speedforge.errors import UserError
from speedforge.records import Task
from speedforge.store.s3server import SeaweedServer
from speedforge.store import StoreError, open_store

TASK = Task(task_id="cpp/x", family="cpp", name="x", source="s")


def listening_ports(pid: int) -> list[tuple[str, int]]:
    connections = psutil.Process(pid).net_connections(kind="inet")
    return [(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]


def port_is_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def use_server(monkeypatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_server_binds_loopback_only_and_stops_without_leftovers(tmp_path, monkeypatch):
    server = SeaweedServer(tmp_path / "s3", bucket="bucket-one").start()
    try:
        pid = server.process.pid
        listening = listening_ports(pid)
        assert listening and all(ip == "127.0.0.1" for ip, _ in listening)
        assert server.ports["s3.port"] in {port for _, port in listening}
        session = [p.pid for p in psutil.process_iter() if _sid(p.pid) == os.getsid(pid)]
        use_server(monkeypatch, server.env())
        open_store("s3://bucket-one/x").append_records("tasks", [TASK])
    finally:
        server.stop()
    assert not psutil.pid_exists(pid)  # stopped and reaped by stop()
    assert not [p for p in session if psutil.pid_exists(p)]
    assert all(port_is_closed(port) for _, port in listening)
    assert not server.leftover_sockets()
    assert not server.running
    server.stop()  # stopping twice is harmless


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_credentials_are_generated_kept_in_the_data_dir_and_required(tmp_path, monkeypatch):
    first = SeaweedServer(tmp_path / "s3", bucket="bucket-two")
    other = SeaweedServer(tmp_path / "other", bucket="bucket-two")
    assert first.access_key != other.access_key and len(first.secret_key) >= 30
    with first:
        assert oct(first.identities_file.stat().st_mode & 0o777) == "0o600"
        use_server(monkeypatch, first.env())
        open_store("s3://bucket-two/x").append_records("tasks", [TASK])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", other.secret_key)
        with pytest.raises(StoreError, match="access denied"):
            open_store("s3://bucket-two/x")
    # AWS_* in the environment (here a mismatched secret) must not leak into the server's identities
    again = SeaweedServer(tmp_path / "s3", bucket="bucket-two")
    assert (again.access_key, again.secret_key) == (first.access_key, first.secret_key)
    with again:  # same data dir: the data is still there
        use_server(monkeypatch, again.env())
        assert open_store("s3://bucket-two/x").read_records("tasks", Task) == [TASK]


def test_a_restarted_server_serves_the_objects_it_had_as_soon_as_start_returns(tmp_path):
    # CI failure of 2026-11-24: after a restart the gateway and the bucket answered while the volume
    # server had not yet registered its volumes, and the first read got InternalError "volume N not
    # found" for seconds. start() must return only once stored objects can be read; the client
    # below makes a single attempt, so a read in that window fails this test.
    server = SeaweedServer(tmp_path / "s3", bucket="restarts")
    with server:
        server.client().put_object(Bucket="restarts", Key="kept/a.json", Body=b"{}")
    for _ in range(3):
        with server:
            client = server.client(retries={"max_attempts": 1})
            assert client.get_object(Bucket="restarts", Key="kept/a.json")["Body"].read() == b"{}"
            listed = client.list_objects_v2(Bucket="restarts")
            assert [o["Key"] for o in listed["Contents"]] == ["kept/a.json"]  # the readiness probe left nothing
            client.put_object(Bucket="restarts", Key="kept/a.json", Body=b"{}")


def test_serve_command_prints_a_usable_endpoint_and_stops_cleanly_on_sigterm(tmp_path, monkeypatch):
    command = [
        sys.executable,
        "-m",
        "speedforge.cli",
        "s3",
        "serve",
        "--dir",
        str(tmp_path / "s3"),
        "--bucket",
        "served",
        "--env-file",
        str(tmp_path / "s3.env"),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            line.startswith("export SPEEDFORGE_S3_ENDPOINT") for line in lines
        ):
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        assert lines and lines[0].startswith("S3 endpoint http://127.0.0.1:"), lines
        env = dict(line[len("export ") :].split("=", 1) for line in lines if line.startswith("export "))
        assert (tmp_path / "s3.env").read_text().count("export ") == len(env) == 4
        weed = psutil.Process(process.pid).children(recursive=True)
        assert [p.name() for p in weed] == ["weed"]
        use_server(monkeypatch, env)
        store = open_store("s3://served/a")
        store.put_bytes("hello.txt", b"hi")
        assert store.get_bytes("hello.txt") == b"hi"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "stopping" in process.stdout.read()
    assert not [p for p in weed if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_invalid_bucket_name_is_refused_before_starting(tmp_path):
    with pytest.raises(UserError, match="invalid bucket name 'b1'"):
        SeaweedServer(tmp_path, bucket="b1")


def test_server_dies_with_a_killed_parent(tmp_path):
    script = (
        f"from speedforge.store.s3server import SeaweedServer\n"
        f"s = SeaweedServer({str(tmp_path / 's3')!r}, bucket='orphan-check').start()\n"
        f"print(s.process.pid, flush=True)\n"
        f"import time; time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        weed_pid = int(parent.stdout.readline())
        assert psutil.Process(weed_pid).name() == "weed"
    finally:
        parent.kill()  # SIGKILL: no finally, no atexit in the parent
        parent.wait()
    deadline = time.monotonic() + 30
    while psutil.pid_exists(weed_pid) and psutil.Process(weed_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "weed outlived its parent"
        time.sleep(0.2)


def _serve(tmp_path, bucket: str = "served") -> tuple[subprocess.Popen, dict[str, str], str]:
    command = [sys.executable, "-m", "speedforge.cli", "s3", "serve", "--dir", str(tmp_path / "s3"), "--bucket", bucket]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(line.startswith("export SPEEDFORGE_S3_ENDPOINT") for line in lines):
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    if not lines or not lines[0].startswith("S3 endpoint"):
        process.kill()
        pytest.fail(f"s3 serve did not start: {lines} {process.communicate()}")
    return process, dict(line[len("export ") :].split("=", 1) for line in lines if line.startswith("export ")), lines[0]


def test_serve_started_again_on_the_same_dir_keeps_its_endpoint_and_a_client_reaches_it(tmp_path, monkeypatch):
    first, env, banner = _serve(tmp_path)
    try:
        use_server(monkeypatch, env)
        store = open_store("s3://served/a")  # opened once, used across the restart (as a running sweep does)
        store.put_bytes("before.txt", b"1")
        first.kill()  # SIGKILL: no clean stop; weed dies with it (parent-death signal)
        first.wait()
        again, env_again, banner_again = _serve(tmp_path)
    finally:
        first.kill()
        first.wait()
    try:
        assert (banner_again, env_again) == (banner, env)
        store.put_bytes("after.txt", b"2")
        assert store.get_bytes("before.txt") == b"1" and store.get_bytes("after.txt") == b"2"
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(30)


def test_a_port_taken_since_the_last_start_gives_new_ports_and_says_so(tmp_path):
    server = SeaweedServer(tmp_path / "s3", bucket=None)
    server.ports = {
        f"{c}.{kind}": p
        for c, p in zip(("s3", "master", "volume", "filer", "admin"), range(1, 6))
        for kind in ("port", "port.grpc")
    }
    server.data_dir.mkdir(parents=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server.ports["s3.port"] = port
        server._save_ports()
        fresh = SeaweedServer(tmp_path / "s3", bucket=None)
        assert fresh._saved_ports(wait_s=0.0) == {}
        assert f"port(s) {port}" in fresh.moved and f"changed from http://127.0.0.1:{port}" in fresh.moved
