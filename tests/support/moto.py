"""moto in server mode on 127.0.0.1: a real HTTP server that the real boto3 (in tests and in the CLI) talks to."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from collections.abc import Iterator

from tests.support.common import BIN, stop, wait_until
from tests.support.vcsim import free_port

KEYS = {"AWS_ACCESS_KEY_ID": "AKIAMOTOTESTKEY00001", "AWS_SECRET_ACCESS_KEY": "moto-Secret-Marker-7731"}


@contextlib.contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """Start moto_server; yield the environment that points boto3 at it, as a user's ``AWS_ENDPOINT_URL`` would."""
    port = free_port()
    proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/moto-api/"), proc, "moto_server")
        yield {
            **KEYS,
            "AWS_ENDPOINT_URL": url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    finally:
        stop(proc)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False
