"""The embedded S3 server dying on its own: `speedforge s3 serve` says so in one line and exits
with an error, and the library reaps the dead `weed` (no zombie)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from speedforge.store.s3server import SeaweedServer


def start_serve(tmp_path) -> tuple[subprocess.Popen, str]:
    """`speedforge s3 serve` in its own process, once it has printed its endpoint."""
    command = [
        sys.executable,
        "-m",
        "speedforge.cli",
        "s3",
        "serve",
        "--dir",
        str(tmp_path / "s3"),
        "--bucket",
        "watched",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("export SPEEDFORGE_S3_ENDPOINT="):
            return process, line.strip().split("=", 1)[1]
    process.kill()
    raise AssertionError(f"s3 serve did not start: {process.communicate()}")


def test_serve_exits_with_one_line_when_its_server_is_killed(tmp_path):
    process, endpoint = start_serve(tmp_path)
    try:
        (weed,) = psutil.Process(process.pid).children()
        assert weed.name() == "weed"
        weed.send_signal(signal.SIGKILL)
        assert process.wait(timeout=15) == 2  # a user error: the CLI's one-line exit
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = process.stderr.read().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"speedforge s3: error: the S3 server stopped: weed (pid {weed.pid}) was killed by SIGKILL"
    )
    assert f"{endpoint} is down" in lines[0] and "start `speedforge s3 serve` again" in lines[0]
    assert "stopping" not in process.stdout.read()


def test_a_dead_server_is_reaped_and_said_how_it_ended(tmp_path):
    server = SeaweedServer(tmp_path / "s3", bucket=None).start()
    try:
        assert server.reap() is None  # running
        pid = server.process.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (ended := server.reap()) is None:
            assert time.monotonic() < deadline, "the killed weed was never noticed"
            time.sleep(0.1)
        assert ended == f"weed (pid {pid}) was killed by SIGKILL"
        assert not psutil.pid_exists(pid)  # reaped: no zombie left
        assert server.reap() == ended and not server.running
    finally:
        server.stop()
    assert server.reap() is None and not server.leftover_sockets()
