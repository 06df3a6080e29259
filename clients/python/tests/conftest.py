"""The real daemon the tests talk to: `turnsnap serve` (TURNSNAP_BIN) on a
home in a temporary directory, over its real unix socket. Needs root
(overlay mounts); exec tests also need runc and busybox."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Iterator, List, Optional, Tuple

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import turnsnap  # noqa: E402

BIN = os.environ.get("TURNSNAP_BIN")
REQUIRE_ALL = os.environ.get("TURNSNAP_REQUIRE_ALL") == "1"


def missing(what: str) -> None:
    if REQUIRE_ALL:
        pytest.fail("missing under TURNSNAP_REQUIRE_ALL: " + what)
    pytest.skip("missing: " + what)


class Daemon:
    """One home and the daemon serving it, which a test may stop, kill
    and start again."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.socket = os.path.join(home, "turnsnap.sock")
        self.proc: Optional["subprocess.Popen[str]"] = None
        self.log: List[str] = []

    def start(self) -> None:
        """Start `turnsnap serve` and return once it serves: it logs
        "serving" after its socket listens, so no polling is needed."""
        assert self.proc is None, "daemon already running"
        assert BIN
        proc = subprocess.Popen([BIN, "--home", self.home, "serve"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        serving = threading.Event()

        def drain() -> None:
            # Reads stderr to its end, so the daemon never blocks on a full pipe.
            assert proc.stderr is not None
            for line in proc.stderr:
                self.log.append(line)
                if "msg=serving " in line:
                    serving.set()
            serving.set()  # exited: start() reports it below

        threading.Thread(target=drain, daemon=True).start()
        serving.wait(60)
        if proc.poll() is not None or not serving.is_set():
            proc.kill()
            proc.wait()
            pytest.fail("daemon did not start:\n" + "".join(self.log))
        self.proc = proc

    def stop(self) -> None:
        """SIGTERM; the daemon exits 0 and removes its socket."""
        assert self.proc is not None
        self.proc.terminate()
        code = self.proc.wait(timeout=60)
        self.proc = None
        assert code == 0, "daemon exit code after SIGTERM: %d\n%s" % (code, "".join(self.log))

    def kill(self) -> None:
        """SIGKILL: the socket file stays behind, nobody listening."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.proc = None


@pytest.fixture
def served() -> Iterator[Tuple[Daemon, turnsnap.Client, str, bool]]:
    """A running daemon with sandbox "py": (daemon, client, base, has_exec)."""
    if not BIN:
        missing("TURNSNAP_BIN (the turnsnap binary)")
    if os.geteuid() != 0:
        missing("root (overlay mounts)")
    d = tempfile.mkdtemp(prefix="turnsnap-py-")
    home, base = os.path.join(d, "home"), os.path.join(d, "base")
    for sub in ("bin", "proc", "dev", "sys", "tmp"):
        os.makedirs(os.path.join(base, sub))
    with open(os.path.join(base, "README"), "w") as f:
        f.write("base\n")
    busybox = shutil.which("busybox") or "/bin/busybox"
    has_exec = os.path.exists(busybox) and shutil.which("runc") is not None
    if has_exec:
        shutil.copy(busybox, os.path.join(base, "bin", "busybox"))
        for a in ("sh", "cat", "echo", "test", "rm", "sleep"):
            os.symlink("busybox", os.path.join(base, "bin", a))
    daemon = Daemon(home)
    daemon.start()
    c = turnsnap.Client(socket=daemon.socket, timeout=120)
    try:
        c.create_sandbox("py", base)
        yield daemon, c, base, has_exec
    finally:
        if daemon.proc is None:  # a test left it stopped or killed
            daemon.start()
        for s in c.sandboxes():
            c.remove_sandbox(s["name"])
        daemon.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(served: Tuple[Daemon, turnsnap.Client, str, bool]) -> Tuple[turnsnap.Client, str, bool]:
    """The client, base and has_exec of a running daemon."""
    return served[1], served[2], served[3]
