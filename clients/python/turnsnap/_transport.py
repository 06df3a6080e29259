"""HTTP to the daemon over its unix socket or TCP: timeouts, the retry
loop, and the translation of socket and http.client failures into the
client's errors (errors.py). Nothing here knows the API's routes."""

import enum
import errno
import http.client
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar, Union

from .errors import (ConnectionLost, DaemonUnavailable, Error, Timeout, TransportError, Unavailable,
                     api_error)

T = TypeVar("T")


class _Default(enum.Enum):
    """The type of DEFAULT (an enum member, so type checkers can tell it
    from a number of seconds and from None)."""
    DEFAULT = "default"


#: "Use the client's setting": the default of every per-call timeout.
DEFAULT = _Default.DEFAULT

#: A per-call timeout: seconds, None for no limit, or DEFAULT.
TimeoutArg = Union[float, None, _Default]


@dataclass(frozen=True)
class Retry:
    """How often a request that is safe to repeat is tried when the daemon
    cannot be reached or the connection breaks.

    ``attempts`` counts every try, the first included (1: never retry).
    The pause before the n-th retry is ``backoff * 2**(n-1)`` capped at
    ``max_backoff``, of which a random half is taken off (jitter), so that
    clients that failed together do not all come back at the same moment.
    With the defaults a request is given up after about 2 to 4 seconds of
    pauses, time for a supervised daemon to restart.
    """

    attempts: int = 5
    backoff: float = 0.25
    max_backoff: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be at least 1 (the first try)")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("Retry backoffs must not be negative")

    def delay(self, retry: int, rng: random.Random) -> float:
        """The pause before retry number ``retry`` (1 is the first retry)."""
        d = min(self.max_backoff, self.backoff * 2.0 ** (retry - 1))
        return d / 2 + rng.uniform(0, d / 2)


#: A policy that tries every request once.
NO_RETRY = Retry(attempts=1)


@dataclass(frozen=True)
class RetryEvent:
    """What ``on_retry`` is told before each pause: the failure, which
    attempt it ended (1 is the first), and the pause before the next."""

    error: TransportError
    attempt: int
    delay: float


# Connect-time failures worth trying again: the daemon is between lives
# (missing or refusing socket), its listen backlog is full (EAGAIN on a
# unix socket), or the network blinked. A permission or name error is not.
_TRANSIENT_CONNECT = {errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN, errno.ECONNRESET,
                      errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH}


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection over a unix socket. ``timeout`` bounds connecting;
    ``read_timeout`` then bounds each wait for the daemon's bytes."""

    def __init__(self, path: str, connect_timeout: Optional[float], read_timeout: Optional[float]) -> None:
        super().__init__("turnsnap", timeout=connect_timeout)
        self._path = path
        self._read_timeout = read_timeout

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
            s.settimeout(self._read_timeout)
        except BaseException:
            s.close()
            raise
        self.sock = s


class _TCPConnection(http.client.HTTPConnection):
    def __init__(self, netloc: str, connect_timeout: Optional[float], read_timeout: Optional[float]) -> None:
        super().__init__(netloc, timeout=connect_timeout)
        self._read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self._read_timeout)


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, netloc: str, connect_timeout: Optional[float], read_timeout: Optional[float],
                 context: Optional[ssl.SSLContext]) -> None:
        super().__init__(netloc, timeout=connect_timeout, context=context)
        self._read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()  # TCP and the TLS handshake, both under the connect timeout
        self.sock.settimeout(self._read_timeout)


class Transport:
    """Sends requests to one daemon. Each request has a connection of its
    own, closed after its response: a unix socket connects in
    microseconds, and no pooled connection can be found dead by the next
    request (which would make a safe request look unsafe to retry).
    Safe for use from several threads."""

    def __init__(self, socket_path: Optional[str], url: Optional[str], token: Optional[str],
                 connect_timeout: Optional[float], timeout: Optional[float], retry: Retry,
                 on_retry: Optional[Callable[[RetryEvent], None]] = None,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.socket_path = socket_path
        self.token = token
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.retry = retry
        self.on_retry = on_retry
        self.ssl_context = ssl_context
        self._url = url
        self._rng = random.Random()
        self._rng_lock = threading.Lock()
        if url:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.netloc or u.username or u.password:
                raise ValueError("url must be http://HOST:PORT or https://HOST:PORT (the token goes in token=)")
            self._scheme, self._netloc = u.scheme, u.netloc
            #: the daemon's address as errors name it
            self.where = "%s://%s" % (u.scheme, u.netloc)
        elif socket_path:
            self.where = "socket " + socket_path
        else:
            raise ValueError("give a socket path or a url")

    def copy(self, **changes: Any) -> "Transport":
        """This transport with some settings changed (Client.with_options)."""
        t = Transport(self.socket_path, self._url, self.token, self.connect_timeout, self.timeout,
                      self.retry, self.on_retry, self.ssl_context)
        for k, v in changes.items():
            if not hasattr(t, k):
                raise TypeError("unknown option %r" % k)
            setattr(t, k, v)
        return t

    def resolve(self, timeout: TimeoutArg) -> Optional[float]:
        """The read timeout a call uses: its own, or the client's."""
        return self.timeout if timeout is DEFAULT else timeout

    # -- one exchange -------------------------------------------------------

    def _connection(self, read_timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixConnection(self.socket_path, self.connect_timeout, read_timeout)
        if self._scheme == "https":
            return _TLSConnection(self._netloc, self.connect_timeout, read_timeout, self.ssl_context)
        return _TCPConnection(self._netloc, self.connect_timeout, read_timeout)

    def headers(self, accept: str, has_body: bool) -> Dict[str, str]:
        h = {"Accept": accept, "User-Agent": "turnsnap-python"}
        if has_body:
            h["Content-Type"] = "application/json"
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def exchange(self, method: str, path: str, body: Optional[bytes], accept: str,
                 timeout: Optional[float], extra: Optional[Mapping[str, str]] = None
                 ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one request and wait for the status line and headers. On 200
        returns the connection and the response, whose body the caller reads
        (through read()) and then closes the connection; any other status
        raises the daemon's problem as an APIError. Never retries."""
        conn = self._connection(timeout)
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as e:
                raise self.wrap(e, method, path, sent=False, timeout=timeout) from e
            try:
                conn.request(method, path, body=body, headers={**self.headers(accept, body is not None), **(extra or {})})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise self.wrap(e, method, path, sent=True, timeout=timeout) from e
            if resp.status != 200:
                raise self.problem(resp, method, path, timeout)
        except BaseException:
            conn.close()
            raise
        return conn, resp

    def read(self, read: Callable[[], T], method: str, path: str, timeout: Optional[float]) -> T:
        """Run a read of a response body, turning its failures into the
        client's errors."""
        try:
            return read()
        except (OSError, http.client.HTTPException) as e:
            raise self.wrap(e, method, path, sent=True, timeout=timeout) from e

    def problem(self, resp: http.client.HTTPResponse, method: str, path: str,
                timeout: Optional[float]) -> Error:
        """The error a non-200 response stands for. A problem+json carries
        its class; anything else (a proxy's page, a truncated body) is the
        daemon failing, class unavailable, as the Go client reads it."""
        data = self.read(lambda: resp.read(1 << 20), method, path, timeout)
        text = data.decode(errors="replace").strip()
        try:
            p = json.loads(data)
        except ValueError:
            p = None
        if isinstance(p, dict) and p.get("detail"):
            return api_error(str(p["detail"]), resp.status, p)
        return Unavailable("turnsnap daemon at %s: %s %s: HTTP %d: %s" % (self.where, method, path, resp.status, text or resp.reason),
                           status=resp.status, klass="unavailable")

    def wrap(self, e: BaseException, method: str, path: str, sent: bool,
             timeout: Optional[float]) -> TransportError:
        """The client's error for a socket or http.client failure. ``sent``
        is whether connecting had succeeded (so the daemon may have the
        request)."""
        what = "turnsnap daemon at %s: %s %s" % (self.where, method, path)
        if isinstance(e, socket.timeout):  # TimeoutError since Python 3.10
            if not sent:
                return Timeout("%s: no connection within %ss (the daemon is overloaded or hung)"
                               % (what, self.connect_timeout), self.where, method, path,
                               request_sent=False, retryable=True, phase="connect", seconds=self.connect_timeout)
            return Timeout("%s: no answer within %ss (the daemon may still be working on it)" % (what, timeout),
                           self.where, method, path, request_sent=True, retryable=False, phase="read",
                           seconds=timeout)
        if not sent:
            if isinstance(e, FileNotFoundError) and self.socket_path:
                why = "the socket is missing: no daemon serves this home (start `turnsnap serve`)"
            elif isinstance(e, ConnectionRefusedError):
                why = "connection refused: no daemon listens (it stopped or was killed)"
            elif isinstance(e, BlockingIOError):
                why = "its connection backlog is full (the daemon is overloaded or hung)"
            elif isinstance(e, socket.gaierror):
                why = "cannot resolve the host: %s" % e
            elif isinstance(e, OSError):
                why = "cannot connect: %s" % (e.strerror or e)
            else:
                why = "cannot connect: %r" % e
            retryable = isinstance(e, OSError) and not isinstance(e, (socket.gaierror, ssl.SSLError)) \
                and e.errno in _TRANSIENT_CONNECT
            return DaemonUnavailable("%s: %s" % (what, why), self.where, method, path,
                                     request_sent=False, retryable=retryable)
        desc = type(e).__name__ + (": %s" % e if str(e) else "")
        return ConnectionLost("%s: connection lost mid-request (%s): the daemon died, restarted or cut the "
                              "response off; whether the request took effect is unknown" % (what, desc),
                              self.where, method, path, request_sent=True, retryable=True)

    # -- retries --------------------------------------------------------------

    def retrying(self, method: str, path: str, idempotent: bool, once: Callable[[], T]) -> T:
        """Run once(), trying again after a retryable transport failure if
        the request is idempotent, up to the policy's attempts. A request
        that is not idempotent is tried exactly once, whatever failed: the
        daemon has no idempotency key that would let it recognise a repeat.
        The daemon's own answers (APIError) are never retried."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return once()
            except TransportError as e:
                e.attempts = attempt
                if not (idempotent and e.retryable and attempt < self.retry.attempts):
                    raise
                with self._rng_lock:
                    pause = self.retry.delay(attempt, self._rng)
                if self.on_retry is not None:
                    self.on_retry(RetryEvent(e, attempt, pause))
                time.sleep(pause)

    def call_json(self, method: str, path: str, body: Any, idempotent: bool, timeout: TimeoutArg) -> Any:
        """One JSON request and its JSON answer, retried if idempotent."""
        payload = None if body is None else json.dumps(body).encode()
        t = self.resolve(timeout)

        def once() -> Any:
            conn, resp = self.exchange(method, path, payload, "application/json", t)
            try:
                data = self.read(resp.read, method, path, t)
            finally:
                conn.close()
            try:
                return json.loads(data)
            except ValueError as e:
                raise Unavailable("turnsnap daemon at %s: %s %s: bad response: %s" % (self.where, method, path, e),
                                  status=resp.status, klass="unavailable") from e

        return self.retrying(method, path, idempotent, once)

