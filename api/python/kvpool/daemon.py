"""Runs `kvpool node serve` daemons as child processes: what the tests, the
demo and the benchmarks start their clusters with.

find_binary() looks for the kvpool binary in $KVPOOL_BIN, then on PATH,
then builds it with `go build` from the repository this package sits in.
Daemon.start() waits until the daemon logs that it serves and reads its
addresses from that log line; stop() ends it with SIGTERM (kill() with
SIGKILL, as a crash). Each daemon's log goes to a file in its directory.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def find_binary():
    """The path of a kvpool binary, building one when none is at hand."""
    env = os.environ.get("KVPOOL_BIN")
    if env:
        return env
    found = shutil.which("kvpool")
    if found:
        return found
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not (_REPO / "go.mod").exists() or not os.path.exists(go):
        raise FileNotFoundError("kvpool binary not found: set KVPOOL_BIN, put kvpool on PATH, or run from a checkout with Go installed")
    out = Path(tempfile.gettempdir()) / "kvpool-python" / "kvpool"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(out), "./cmd/kvpool"], cwd=_REPO, check=True)
    return str(out)


class Daemon:
    """One `kvpool node serve` process."""

    def __init__(self, proc, node_id, addr, etcd_url, directory, log_path):
        self.proc, self.node_id, self.addr = proc, node_id, addr
        self.etcd_url, self.dir, self.log_path = etcd_url, directory, log_path
        self.shm_socket = str(Path(directory) / "shm.sock")

    @classmethod
    def start(cls, node_id, directory, capacity="256MiB", etcd_url=None, standalone=False, extra=(), binary=None, timeout=30.0):
        """Starts a daemon with its files under directory. Without etcd_url
        (and not standalone) it runs an embedded etcd that others join
        through its etcd_url."""
        binary = binary or find_binary()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        args = [binary, "node", "serve", "--node-id", node_id, "--capacity", capacity,
                "--listen", "127.0.0.1:0", "--metrics-listen", "", "--shm-socket", str(d / "shm.sock"),
                "--log-format", "json"]
        if standalone:
            args.append("--standalone")
        elif etcd_url:
            args += ["--etcd-endpoints", etcd_url]
        else:
            args += ["--embedded-etcd-listen", "127.0.0.1:0", "--etcd-data-dir", str(d / "etcd")]
        args += list(extra)
        log_path = d / "serve.log"
        log = open(log_path, "wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        addr, url = None, None
        deadline = time.monotonic() + timeout
        while addr is None:
            if proc.poll() is not None:
                raise RuntimeError(f"kvpool node {node_id} exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                proc.kill()
                raise TimeoutError(f"kvpool node {node_id} did not start within {timeout} s:\n{log_path.read_text()[-4000:]}")
            for line in log_path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "embedded etcd serving":
                    url = rec.get("client_url")
                if rec.get("msg") == "kvpool node starting":
                    addr = rec.get("listen")
            if addr is None:
                time.sleep(0.05)  # a child process's log: nothing to wait on but the file
        return cls(proc, node_id, addr, url or etcd_url, str(d), str(log_path))

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after timeout. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self):
        """SIGKILL: the daemon dies as in a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def log(self):
        return Path(self.log_path).read_text()
