"""A real S3 API server on loopback for the whole session (moto's server mode), driven through s3fs.

The server runs as its own process, started once per session on a free port; each test gets a
fresh bucket and an environment (``AWS_ENDPOINT_URL`` and fake credentials) that it hands to the
runs it starts. Credentials and endpoint reach s3fs only through the backend's own environment
variables, as they would on a real cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["bucket", "nothing_left_behind", "s3_env", "s3_server"]

if os.environ.get("PHALANX_REQUIRE_S3") == "1":  # CI installs both: a skip there would hide the folder
    import moto.server  # noqa: F401
    import s3fs  # noqa: F401
pytest.importorskip("moto.server", reason="the remote tests need moto[server] (pip install 'moto[server]' s3fs)")
pytest.importorskip("s3fs", reason="the remote tests need s3fs (pip install 'moto[server]' s3fs)")

_SCRIPTS = str(Path(__file__).parent / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)

#: What a run needs to reach the server, and nothing from the machine's own AWS configuration.
_FAKE = {
    "AWS_ACCESS_KEY_ID": "phalanx-test",
    "AWS_SECRET_ACCESS_KEY": "phalanx-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_MAX_ATTEMPTS": "2",
    "AWS_RETRY_MODE": "standard",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of a moto S3 server that lives as long as the session."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto's S3 server did not start on port {port} (exit code {process.poll()})")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's environment pointed at the server (restored afterwards); also for its subprocesses."""
    values = {**_FAKE, "AWS_ENDPOINT_URL": s3_server}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    _fresh_filesystems()
    return dict(os.environ)


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> Iterator[str]:
    """A new, empty bucket (its name), deleted with its objects after the test."""
    import s3fs

    name = f"phalanx-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    yield name
    fs.invalidate_cache()
    fs.rm(name, recursive=True)  # every key, the folder markers a logger's makedirs leaves too, then the bucket
    if fs.exists(name):
        fs.rmdir(name)
    _fresh_filesystems()


def _fresh_filesystems() -> None:
    """Forget cached s3fs instances, so the next one reads this test's endpoint and credentials."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
