"""Real services for integration tests: started on 127.0.0.1, free ports, temporary dirs.

In CI (``CI=true``) a missing binary fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest


def in_ci() -> bool:
    """Whether the suite runs in CI (``CI=true``, ``1`` or ``yes``), where nothing may be skipped."""
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(message: str) -> None:
    """Stop a test (or a whole module) that cannot run here: a failure in CI, a skip that says why elsewhere."""
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (make test installs it from Debian packages)")
    return path


def require_module(name: str):
    """Import an optional package the tests need; in CI its absence fails instead of skipping.

    Use it instead of ``pytest.importorskip``, which skips in CI too.
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        unavailable(f"{name} is not installed (make test installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last error
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last!r})")


def http_get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class Service:
    """A process started for a test and stopped afterwards; its output goes to a log file."""

    def __init__(self, name: str, args: list[str], workdir: Path, ready_url: str | None, ready_timeout: float = 30,
                 env: dict[str, str] | None = None):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=None if env is None else {**os.environ, **env})
        if ready_url is not None:
            try:
                wait_for(lambda: self._alive() and http_get(ready_url) is not None, ready_timeout, f"{name} at {ready_url}")
            except AssertionError:
                self.stop()
                raise AssertionError(f"{name} did not start:\n{self.log_path.read_text()[-2000:]}") from None

    def _alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}")
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def start_prometheus(
    workdir: Path,
    targets: dict[str, str],
    honor_labels: bool = False,
    rule_files: list[Path] = (),
    alertmanager: str | None = None,
    features: tuple[str, ...] = (),
) -> tuple[Service, str]:
    """Prometheus scraping ``targets`` ({job: host:port}) every second, with rules, an Alertmanager and
    ``--enable-feature`` flags (``exemplar-storage``)."""
    binary = require_binary("prometheus")
    port = free_port()
    jobs = "\n".join(
        f"  - job_name: {job}\n    honor_labels: {str(honor_labels).lower()}\n"
        f"    static_configs:\n      - targets: ['{target}']"
        for job, target in targets.items()
    )
    extra = ""
    if rule_files:
        extra += "rule_files:\n" + "".join(f"  - {path}\n" for path in rule_files)
    if alertmanager:
        extra += f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{alertmanager}']\n"
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{extra}scrape_configs:\n{jobs}\n"
    )
    url = f"http://127.0.0.1:{port}"
    service = Service(
        "prometheus",
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *(f"--enable-feature={feature}" for feature in features),
        ],
        workdir,
        f"{url}/-/ready",
    )
    return service, url


def start_prometheus_with(
    workdir: Path, config: Path, name: str = "prometheus", flags: Sequence[str] = ()
) -> tuple[Service, str]:
    """Prometheus on 127.0.0.1 with a configuration file of the caller's and its own data in ``workdir/<name>-data``.

    ``flags`` are added as given: ``--enable-feature=agent`` (agent mode: scrape and remote-write, no local
    queries or rules; its data then go to ``--storage.agent.path``), ``--web.enable-remote-write-receiver``
    (accept remote writes at ``/api/v1/write``). ``name`` names its log and data, so that several run side by
    side in one directory (an agent per node and a central one).
    """
    binary = require_binary("prometheus")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    storage = "agent" if "--enable-feature=agent" in flags else "tsdb"
    args = [binary, f"--config.file={config}", f"--storage.{storage}.path={workdir / (name + '-data')}",
            f"--web.listen-address=127.0.0.1:{port}", *flags]
    return Service(name, args, workdir, f"{url}/-/ready"), url


def start_pushgateway(workdir: Path) -> tuple[Service, str]:
    binary = require_binary("prometheus-pushgateway")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Debian's build persists to /var/lib/prometheus by default: keep each test's gateway to itself.
    args = [binary, f"--web.listen-address=127.0.0.1:{port}", f"--persistence.file={workdir / 'pushgateway.data'}"]
    service = Service("pushgateway", args, workdir, f"{url}/-/ready")
    return service, url


def start_mlflow_server(workdir: Path, store: Path) -> tuple[Service, str]:
    import sys

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")
    service = Service(
        "mlflow",
        [
            str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{store}",
            "--default-artifact-root", str(workdir / "artifacts"),
            "--workers", "1",
        ],
        workdir,
        f"{url}/health",
        ready_timeout=300,  # a hang guard: MLflow's server imports for a minute and more on a busy machine
        # Without MLflow 3's job runner (GenAI scorers and prompt optimization, nothing advmon calls): with it
        # each server started a job runner and eight huey consumers, each importing MLflow, 36 s of CPU a start.
        env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    return service, url


def start_alertmanager(workdir: Path, config: Path) -> tuple[Service, str]:
    """Alertmanager on 127.0.0.1 with its cluster port off."""
    binary = require_binary("prometheus-alertmanager")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = Service(
        "alertmanager",
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        workdir,
        f"{url}/-/ready",
    )
    return service, url


class FakeSlack:
    """A local HTTP server standing in for a Slack incoming webhook: it records what is posted."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        posts = self.posts = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                posts.append({"path": self.path, "json": json.loads(body or b"null")})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/secret-token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Unanswering:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers: a backend that hangs.

    ``port`` is free by default or one a stopped service left; ``held`` are the connections taken;
    ``close()`` drops them and stops listening, so a client's next attempt is refused at once.
    """

    def __init__(self, port: int = 0) -> None:
        import threading

        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a stopped service's port
        self._socket.bind(("127.0.0.1", port))
        self._socket.listen(50)
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._swallow, daemon=True).start()

    def _swallow(self) -> None:
        while True:
            try:
                self.held.append(self._socket.accept()[0])
            except OSError:  # closed
                return

    def close(self) -> None:
        try:  # wakes the blocked accept(): a plain close() would leave the kernel listening until it returns
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()
        for connection in self.held:
            connection.close()

    def __enter__(self) -> Unanswering:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def mlflow_sqlite_store(directory: Path) -> str:
    """A new MLflow sqlite store in ``directory`` whose artifacts stay there too; its tracking URI.

    A store a client creates gives its default experiment ``./mlruns`` of the current directory
    (the repository, under pytest) for artifacts: created here first, they go to ``directory/artifacts``.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{directory / 'mlflow.db'}"
    SqlAlchemyStore(uri, (directory / "artifacts").as_uri()).engine.dispose()
    return uri
