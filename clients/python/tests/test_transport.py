"""Transport failures against a real daemon over its real socket: a daemon
that is down, killed mid-request or slow raises the client's typed errors,
never a raw socket or http.client exception; idempotent requests are
retried through a daemon restart, other requests are never retried; the
daemon's problem classes map to their exception types."""

import http.client
import os
import socket
import sys
import tempfile
import threading
from typing import Any, Callable, List, Tuple, Type

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import turnsnap  # noqa: E402

from conftest import missing  # noqa: E402

# Quick retries, so tests of a missing daemon take milliseconds.
FAST = turnsnap.Retry(attempts=4, backoff=0.001, max_backoff=0.002)


def raw(e: BaseException) -> bool:
    """Whether e is an exception the client must not let out."""
    return isinstance(e, (OSError, http.client.HTTPException)) and not isinstance(e, turnsnap.Error)


def test_socket_missing_is_daemon_unavailable() -> None:
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "turnsnap.sock")
        retries: List[turnsnap.RetryEvent] = []
        c = turnsnap.Client(socket=sock, retry=FAST, on_retry=retries.append)
        with pytest.raises(turnsnap.DaemonUnavailable) as e:
            c.status()
        err = e.value
        assert sock in str(err) and err.where == "socket " + sock and "missing" in str(err)
        assert not err.request_sent and err.klass == "unavailable" and err.exit_code == 6
        assert isinstance(err.__cause__, FileNotFoundError)
        # A GET was tried every time the policy allows, a pause before each retry.
        assert err.attempts == 4 and [r.attempt for r in retries] == [1, 2, 3]
        assert all(0 < r.delay <= FAST.max_backoff for r in retries)


def test_connection_refused_is_daemon_unavailable() -> None:
    # A socket file nobody listens on, as a killed daemon leaves behind.
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "turnsnap.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sock)
        try:
            c = turnsnap.Client(socket=sock, retry=FAST)
            with pytest.raises(turnsnap.DaemonUnavailable) as e:
                c.log("py")
            assert "refused" in str(e.value) and isinstance(e.value.__cause__, ConnectionRefusedError)
            assert e.value.attempts == 4 and not e.value.request_sent
        finally:
            s.close()


def test_hung_daemon_times_out_once() -> None:
    # A socket that listens and never answers, as a hung daemon's does: the
    # connection is made (the kernel queues it), the answer never comes.
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "turnsnap.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sock)
        s.listen(8)
        try:
            retries: List[turnsnap.RetryEvent] = []
            c = turnsnap.Client(socket=sock, timeout=5, retry=FAST, on_retry=retries.append)
            with pytest.raises(turnsnap.Timeout) as e:
                c.status(timeout=0.2)  # the per-call timeout wins over the client's
            err = e.value
            assert err.phase == "read" and err.seconds == 0.2 and err.request_sent and sock in str(err)
            assert isinstance(err.__cause__, TimeoutError)
            # Not retried even though a GET is safe to repeat: the daemon
            # is there and may still be working on the first one.
            assert err.attempts == 1 and retries == []
        finally:
            s.close()


def test_no_daemon_on_tcp_is_daemon_unavailable() -> None:
    # A port that was just free: nothing listens on it.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = turnsnap.Client(url="http://127.0.0.1:%d" % port, token="t", retry=turnsnap.NO_RETRY)
    with pytest.raises(turnsnap.DaemonUnavailable) as e:
        c.sandboxes()
    assert e.value.where == "http://127.0.0.1:%d" % port and e.value.attempts == 1


def test_stopped_daemon_non_idempotent_not_retried(served: Any) -> None:
    d, c, _, _ = served
    d.stop()
    retries: List[turnsnap.RetryEvent] = []
    c = c.with_options(retry=FAST, on_retry=retries.append)
    once: List[Callable[[], Any]] = [
        lambda: c.checkpoint("py", message="x"), lambda: c.rollback("py", "HEAD"), lambda: c.tag("t", "HEAD"),
        lambda: c.remove_sandbox("py"), lambda: c.exec("py", ["true"]), lambda: c.forget("py", keep_last=1),
        lambda: c.branch("HEAD", "b"), lambda: c.restore("py", "HEAD", ["/README"]), lambda: c.apply_policies()]
    for call in once:
        with pytest.raises(turnsnap.DaemonUnavailable) as e:
            call()
        assert e.value.attempts == 1 and not e.value.request_sent
    assert retries == []
    # The idempotent ones are retried, POSTs among them.
    retried: List[Callable[[], Any]] = [
        lambda: c.sandbox_path("py"), lambda: c.verify("HEAD"), lambda: c.sync(),
        lambda: c.forget("py", dry_run=True, keep_last=1), lambda: c.set_policy("py", keep_last=1),
        lambda: c.clear_policy("py"), lambda: c.log("py"), lambda: c.cat("HEAD", "/README"),
        lambda: c.events()]
    for call in retried:
        with pytest.raises(turnsnap.DaemonUnavailable) as e:
            call()
        assert e.value.attempts == FAST.attempts
    assert len(retries) == len(retried) * (FAST.attempts - 1)


def test_idempotent_call_retried_through_restart(served: Any) -> None:
    d, c, _, _ = served
    cp = c.checkpoint("py", message="before the restart")
    d.stop()
    failed = threading.Event()
    retries: List[turnsnap.RetryEvent] = []

    def on_retry(ev: turnsnap.RetryEvent) -> None:
        retries.append(ev)
        failed.set()

    patient = c.with_options(retry=turnsnap.Retry(attempts=400, backoff=0.02, max_backoff=0.1), on_retry=on_retry)
    got: List[Any] = []
    t = threading.Thread(target=lambda: got.append(_outcome(lambda: patient.log("py"))))
    t.start()
    assert failed.wait(60), "the call never failed while the daemon was down"
    d.start()
    t.join(120)
    assert not t.is_alive()
    assert not isinstance(got[0], BaseException), got[0]
    assert got[0][0]["id"] == cp["id"]
    assert retries and all(isinstance(r.error, turnsnap.DaemonUnavailable) for r in retries)


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except BaseException as e:  # the test thread hands everything back
        return e


def test_daemon_killed_mid_exec(served: Any) -> None:
    d, c, _, has_exec = served
    if not has_exec:
        missing("runc and busybox (exec)")
    started = threading.Event()

    def on_output(stream: str, data: bytes) -> None:
        if b"started" in data:
            started.set()

    got: List[Any] = []
    cmd = "echo run >> /tmp/runs; echo started; exec sleep 100000"
    retrying = c.with_options(retry=turnsnap.Retry(attempts=50, backoff=0.01))
    t = threading.Thread(target=lambda: got.append(_outcome(
        lambda: retrying.exec("py", ["sh", "-c", cmd], on_output=on_output))))
    t.start()
    assert started.wait(120), "the command's output never came"
    d.kill()
    t.join(60)
    assert not t.is_alive()
    err = got[0]
    # The exec had started, so not DaemonUnavailable: the connection broke.
    assert isinstance(err, turnsnap.ConnectionLost), repr(err)
    assert not raw(err) and err.request_sent and d.socket in str(err)
    assert isinstance(err.__cause__, (OSError, http.client.HTTPException)), repr(err.__cause__)
    # An exec is never retried: the command ran once.
    assert err.attempts == 1
    d.start()
    assert c.exec("py", ["cat", "/tmp/runs"]).stdout == b"run\n"


def test_daemon_killed_mid_events(served: Any) -> None:
    d, c, _, _ = served
    with c.events(sandbox="py") as events:  # subscribed once this returns
        c.checkpoint("py")
        assert next(events)["type"] == "started"
        d.kill()
        with pytest.raises(turnsnap.ConnectionLost) as e:
            for _ in events:
                pass
    assert e.value.request_sent and isinstance(e.value.__cause__, (OSError, http.client.HTTPException))
    # Killed, its socket stays: connection refused, not a raw exception.
    with pytest.raises(turnsnap.DaemonUnavailable) as e2:
        c.with_options(retry=turnsnap.NO_RETRY).status()
    assert "refused" in str(e2.value)


def test_events_end_when_daemon_stops(served: Any) -> None:
    d, c, _, _ = served
    events = c.events()
    d.stop()
    assert list(events) == []


def test_timeout_on_slow_calls(served: Any) -> None:
    _, c, _, has_exec = served
    retries: List[turnsnap.RetryEvent] = []
    c = c.with_options(on_retry=retries.append)
    # A quiet event stream is a slow call: nothing comes within the timeout.
    with c.events(sandbox="nosuch", timeout=0.2) as events:
        with pytest.raises(turnsnap.Timeout) as e:
            next(events)
    assert e.value.phase == "read" and e.value.seconds == 0.2 and e.value.request_sent
    assert isinstance(e.value.__cause__, TimeoutError) and "0.2s" in str(e.value)
    # A read timeout is not retried even for a GET: the daemon is alive and
    # may still be working on the first request.
    assert e.value.attempts == 1 and retries == []
    if not has_exec:
        missing("runc and busybox (exec)")
    with pytest.raises(turnsnap.Timeout) as e:
        c.exec("py", ["sleep", "30"], timeout=0.3)
    assert e.value.attempts == 1 and retries == [] and "0.3s" in str(e.value)
    assert c.exec("py", ["echo", "alive"]).stdout == b"alive\n"


def test_api_errors_map_to_their_types(served: Any) -> None:
    _, c, base, _ = served
    cases: List[Tuple[Callable[[], Any], Type[turnsnap.APIError], int]] = [
        (lambda: c.sandbox("nosuch"), turnsnap.NotFound, 404),
        (lambda: c.get_checkpoint("ffffffffff"), turnsnap.NotFound, 404),
        (lambda: c._call("GET", "/v1/no/such/route"), turnsnap.NotFound, 404),
        (lambda: c.create_sandbox("py", base), turnsnap.Exists, 409),
        (lambda: c.create_sandbox("bad/name", base), turnsnap.Invalid, 400),
        (lambda: c._call("POST", "/v1/sandboxes", {"nosuch": 1}), turnsnap.Invalid, 400),
        (lambda: c.sync(), turnsnap.Precondition, 412),
    ]
    for call, typ, status in cases:
        with pytest.raises(typ) as e:
            call()
        err = e.value
        assert isinstance(err, turnsnap.APIError) and not isinstance(err, turnsnap.TransportError)
        assert err.status == status and err.problem["class"] == err.klass == typ.klass
        assert err.exit_code == turnsnap.EXIT_CODES[typ.klass] and err.message == err.problem["detail"]
    cp = c.checkpoint("py")
    c.tag("good", cp["id"])
    with pytest.raises(turnsnap.Exists):
        c.tag("good", cp["id"])  # why a tag is not retried


@pytest.mark.parametrize("klass,typ,code", [
    ("not_found", turnsnap.NotFound, 3), ("exists", turnsnap.Exists, 4), ("invalid", turnsnap.Invalid, 2),
    ("precondition", turnsnap.Precondition, 5), ("unavailable", turnsnap.Unavailable, 6),
    ("corrupt", turnsnap.Corrupt, 7), ("no_space", turnsnap.NoSpace, 8), ("key", turnsnap.KeyError_, 9),
    ("error", turnsnap.APIError, 1), ("from_a_newer_daemon", turnsnap.APIError, 1),
])
def test_problem_classes(klass: str, typ: Type[turnsnap.APIError], code: int) -> None:
    # The classes the daemon cannot be made to send on demand (corrupt
    # data, a full disk, a wrong key) go through the same mapping.
    from turnsnap.errors import api_error
    err = api_error("detail", 500, {"class": klass, "detail": "detail"})
    assert type(err) is typ and err.klass == klass and err.exit_code == code and err.status == 500
