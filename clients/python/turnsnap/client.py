"""The client of one daemon: one method per API route (docs/openapi.yaml).

Which requests the client retries after a transport failure follows from
what the daemon guarantees. The daemon has no idempotency key (no
``Idempotency-Key`` header or request id): it cannot recognise a repeated
request, so the client only retries requests whose repeat is harmless by
the daemon's own semantics. Each method's docstring says "Retried" or
"Not retried"; README.md has the table and the reasons.
"""

import base64
import http.client
import json
import os
import ssl
import urllib.parse
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Type, Union, cast, overload

from ._transport import DEFAULT, Retry, RetryEvent, TimeoutArg, Transport, _Default
from .errors import ConnectionLost, api_error

JSON = Dict[str, Any]

#: How long connecting may take by default (seconds). A daemon that does
#: not accept in this long is hung or drowning; either way, say so.
DEFAULT_CONNECT_TIMEOUT = 5.0

#: How long a call waits for the daemon's answer by default (seconds). Long
#: enough for a checkpoint of a big sandbox or a rollback; a sync of
#: gigabytes, gc or store verify may need a per-call ``timeout=None``.
DEFAULT_TIMEOUT = 300.0


class ExecResult:
    """A finished exec: its exit code and output."""

    def __init__(self, exit_code: int, stdout: bytes, stderr: bytes) -> None:
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr

    def __repr__(self) -> str:
        return "ExecResult(exit_code=%d, stdout=%r, stderr=%r)" % (self.exit_code, self.stdout, self.stderr)


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Client:
    """A client of one daemon. Give a socket path, or a URL and a token;
    with neither, the socket of $TURNSNAP_HOME (default /var/lib/turnsnap).

    ``timeout`` bounds each wait for the daemon's answer (seconds; None: no
    limit) and ``connect_timeout`` connecting; every method takes its own
    ``timeout=`` too. ``retry`` says how often a request that is safe to
    repeat is tried when the daemon cannot be reached or the connection
    breaks (``NO_RETRY`` to never retry); ``on_retry`` is called before
    each pause (to log it, say). Creating a client does not connect.

    A client holds no connection between calls and may be shared by threads.
    """

    def __init__(self, socket: Optional[str] = None, url: Optional[str] = None, token: Optional[str] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, *,
                 connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
                 retry: Optional[Retry] = None,
                 on_retry: Optional[Callable[[RetryEvent], None]] = None,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        if socket and url:
            raise ValueError("give a socket or a url, not both")
        if not url:
            socket = socket or os.path.join(os.environ.get("TURNSNAP_HOME", "/var/lib/turnsnap"), "turnsnap.sock")
        self._t = Transport(socket if not url else None, url, token, connect_timeout, timeout,
                            retry if retry is not None else Retry(), on_retry, ssl_context)

    @property
    def socket_path(self) -> Optional[str]:
        """The unix socket this client uses (None over TCP)."""
        return self._t.socket_path

    @property
    def where(self) -> str:
        """The daemon's address as errors name it."""
        return self._t.where

    def with_options(self, *, timeout: TimeoutArg = DEFAULT, connect_timeout: TimeoutArg = DEFAULT,
                     retry: Optional[Retry] = None,
                     on_retry: Union[Callable[[RetryEvent], None], None, _Default] = DEFAULT) -> "Client":
        """A client of the same daemon with some settings changed; this one
        is unchanged. ``c.with_options(retry=NO_RETRY).status()``."""
        changes: Dict[str, Any] = {}
        if timeout is not DEFAULT:
            changes["timeout"] = timeout
        if connect_timeout is not DEFAULT:
            changes["connect_timeout"] = connect_timeout
        if retry is not None:
            changes["retry"] = retry
        if on_retry is not DEFAULT:
            changes["on_retry"] = on_retry
        c = Client.__new__(Client)
        c._t = self._t.copy(**changes)
        return c

    def _call(self, method: str, path: str, body: Any = None, *, idempotent: Optional[bool] = None,
              timeout: TimeoutArg = DEFAULT) -> Any:
        """One JSON request. A GET is retried; anything else only when the
        caller says it is idempotent."""
        if idempotent is None:
            idempotent = method == "GET"
        return self._t.call_json(method, path, body, idempotent, timeout)

    def _obj(self, method: str, path: str, body: Any = None, *, idempotent: Optional[bool] = None,
             timeout: TimeoutArg = DEFAULT) -> JSON:
        return cast(JSON, self._call(method, path, body, idempotent=idempotent, timeout=timeout))

    def _list(self, method: str, path: str, body: Any = None, *, idempotent: Optional[bool] = None,
              timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        return cast(List[JSON], self._call(method, path, body, idempotent=idempotent, timeout=timeout))

    # -- the daemon ---------------------------------------------------------

    def ping(self, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """The daemon's health: ``{"status": "ok", "home": ...}``. Retried."""
        return self._obj("GET", "/healthz", timeout=timeout)

    def status(self, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """The home's status (``turnsnap status --json``). Retried."""
        return self._obj("GET", "/v1/status", timeout=timeout)

    # -- sandboxes ------------------------------------------------------------

    def create_sandbox(self, name: str, base: str, backend: Optional[str] = None,
                       btrfs_pool: Optional[str] = None, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Create a sandbox from a base directory (its turn 0 checkpoint).
        Not retried: a repeat of a create that took effect is Exists."""
        body: JSON = {"name": name, "base": os.path.abspath(base)}
        if backend:
            body["backend"] = backend
        if btrfs_pool:
            body["btrfs_pool"] = os.path.abspath(btrfs_pool)
        return self._obj("POST", "/v1/sandboxes", body, timeout=timeout)

    def sandboxes(self, *, timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        """Every sandbox with its head. Retried."""
        return self._list("GET", "/v1/sandboxes", timeout=timeout)

    def sandbox(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """One sandbox. Retried."""
        return self._obj("GET", "/v1/sandboxes/" + _q(name), timeout=timeout)

    def sandbox_path(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> str:
        """The sandbox's root directory on this host, mounted if it was not.
        Retried: mounting a mounted root changes nothing."""
        return str(self._obj("POST", "/v1/sandboxes/%s/mount" % _q(name), idempotent=True, timeout=timeout)["root"])

    def remove_sandbox(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Remove a sandbox (its checkpoints stay). Not retried: a repeat of
        a removal that took effect is NotFound."""
        return self._obj("DELETE", "/v1/sandboxes/" + _q(name), timeout=timeout)

    # -- turns ----------------------------------------------------------------

    def checkpoint(self, name: str, turn: Optional[int] = None, message: Optional[str] = None,
                   wait_remote: bool = False, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Close a turn; returns what ``turnsnap checkpoint --json`` prints.
        Not retried: a repeat would record another turn. After a
        ConnectionLost or a read Timeout, ``log(name)`` shows whether it
        was taken."""
        body: JSON = {}
        if turn is not None:
            body["turn"] = turn
        if message:
            body["message"] = message
        if wait_remote:
            body["wait_remote"] = True
        return self._obj("POST", "/v1/sandboxes/%s/checkpoints" % _q(name), body, timeout=timeout)

    def log(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        """The sandbox's checkpoints, newest first. Retried."""
        return self._list("GET", "/v1/sandboxes/%s/checkpoints" % _q(name), timeout=timeout)

    def get_checkpoint(self, ref: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """One checkpoint by id, unique prefix or tag. Retried."""
        return self._obj("GET", "/v1/checkpoints/" + _q(ref), timeout=timeout)

    def diff(self, name: str, frm: Optional[str] = None, to: Optional[str] = None, *,
             timeout: TimeoutArg = DEFAULT) -> JSON:
        """What changed between two checkpoints (default: head and the
        live sandbox). Retried."""
        q = {k: v for k, v in (("from", frm), ("to", to)) if v}
        path = "/v1/sandboxes/%s/diff" % _q(name)
        return self._obj("GET", path + ("?" + urllib.parse.urlencode(q) if q else ""), timeout=timeout)

    def rollback(self, name: str, checkpoint: str, fs_only: bool = False, *,
                 timeout: TimeoutArg = DEFAULT) -> JSON:
        """Put the sandbox back to a checkpoint. Not retried."""
        return self._obj("POST", "/v1/sandboxes/%s/rollback" % _q(name),
                          {"checkpoint": checkpoint, "fs_only": fs_only}, timeout=timeout)

    def abandon_rollback(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Discard the sandbox's interrupted rollback instead of finishing it:
        the root goes back to the head. Not retried."""
        return self._obj("POST", "/v1/sandboxes/%s/rollback" % _q(name), {"abandon": True}, timeout=timeout)

    def branch(self, checkpoint: str, name: str, count: Optional[int] = None, fs_only: bool = False, *,
               timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        """New sandbox(es) from a checkpoint; with count, NAME-1 ... NAME-count.
        Returns the list of restores. Not retried: a repeat is Exists."""
        body: JSON = {"name": name, "fs_only": fs_only}
        if count:
            body["count"] = count
        return self._list("POST", "/v1/checkpoints/%s/branches" % _q(checkpoint), body, timeout=timeout)

    def verify(self, ref: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Re-read and check every object of a checkpoint. Retried: it only
        reads."""
        return self._obj("POST", "/v1/checkpoints/%s/verify" % _q(ref), idempotent=True, timeout=timeout)

    def tag(self, tag: str, checkpoint: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Name a checkpoint. Not retried: the daemon refuses an existing
        tag (Exists), so a repeat of a tag that took effect would fail."""
        return self._obj("PUT", "/v1/tags/" + _q(tag), {"checkpoint": checkpoint}, timeout=timeout)

    def tags(self, *, timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        """Every tag. Retried."""
        return self._list("GET", "/v1/tags", timeout=timeout)

    def sync(self, sandbox: Optional[str] = None, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Return once everything queued (for one sandbox, or all) is in the
        remote store. Retried: a repeat uploads only what is still queued
        (its counts are then those of the last attempt)."""
        return self._obj("POST", "/v1/sync", {"sandbox": sandbox} if sandbox else {}, idempotent=True,
                          timeout=timeout)

    # -- paths, lineage, retention (the everyday commands) -------------------

    def cat(self, ref: str, path: str, *, timeout: TimeoutArg = DEFAULT) -> bytes:
        """The bytes of the file at path as it was in checkpoint ref.
        Retried until the file starts coming. A file the daemon could not
        read whole (a damaged chunk mid-file) raises ConnectionLost: the
        daemon cuts the stream off, so a partial file is never returned as
        a whole one (``turnsnap cat`` or ``verify`` names the object)."""
        p = "/v1/checkpoints/%s/content?path=%s" % (_q(ref), _q(path))
        t = self._t.resolve(timeout)
        conn, resp = self._t.retrying("GET", p, True, lambda: self._t.exchange(
            "GET", p, None, "application/octet-stream", t))
        try:
            return self._t.read(resp.read, "GET", p, t)
        finally:
            conn.close()

    def ls(self, ref: str, path: str = "/", *, timeout: TimeoutArg = DEFAULT) -> List[JSON]:
        """The entries of a directory in a checkpoint. Retried."""
        return self._list("GET", "/v1/checkpoints/%s/entries?path=%s" % (_q(ref), _q(path)), timeout=timeout)

    def restore(self, name: str, checkpoint: str, paths: Iterable[str], *,
                timeout: TimeoutArg = DEFAULT) -> JSON:
        """Put paths back into the sandbox as they were in checkpoint. Not
        retried."""
        return self._obj("POST", "/v1/sandboxes/%s/restore" % _q(name),
                          {"checkpoint": checkpoint, "paths": list(paths)}, timeout=timeout)

    def lineage(self, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Every checkpoint of the home, children before parents (log --all).
        Retried."""
        return self._obj("GET", "/v1/lineage", timeout=timeout)

    def ps(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """The sandbox's processes. Retried."""
        return self._obj("GET", "/v1/sandboxes/%s/ps" % _q(name), timeout=timeout)

    def forget(self, sandbox: Optional[str] = None, all: bool = False, dry_run: bool = False, gc: bool = False,
               *, timeout: TimeoutArg = DEFAULT, **policy: int) -> JSON:
        """Delete the checkpoints a policy (keep_last=N, keep_daily=N, ...)
        does not keep, of one sandbox or, with all=True, every one.
        Retried only with dry_run=True (then it deletes nothing)."""
        body: JSON = {"policy": policy, "dry_run": dry_run, "gc": gc}
        if sandbox:
            body["sandbox"] = sandbox
        if all:
            body["all"] = True
        return self._obj("POST", "/v1/forget", body, idempotent=dry_run, timeout=timeout)

    def policies(self, sandbox: Optional[str] = None, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """The retention policies in force. Retried."""
        return self._obj("GET", "/v1/policies" + ("?sandbox=" + _q(sandbox) if sandbox else ""), timeout=timeout)

    def set_policy(self, sandbox: Optional[str] = None, *, timeout: TimeoutArg = DEFAULT, **policy: int) -> JSON:
        """Store a retention policy for a sandbox or the home. Retried: the
        daemon replaces the policy, so a repeat stores the same one."""
        body: JSON = {"policy": policy}
        if sandbox:
            body["sandbox"] = sandbox
        return self._obj("PUT", "/v1/policies", body, idempotent=True, timeout=timeout)

    def clear_policy(self, sandbox: Optional[str] = None, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Remove a sandbox's (or the home's) policy. Retried: clearing a
        cleared policy changes nothing and answers the same."""
        return self._obj("DELETE", "/v1/policies" + ("?sandbox=" + _q(sandbox) if sandbox else ""),
                          idempotent=True, timeout=timeout)

    def apply_policies(self, gc: bool = False, *, timeout: TimeoutArg = DEFAULT) -> JSON:
        """Apply every stored policy now. Not retried: a repeat would report
        nothing deleted."""
        return self._obj("POST", "/v1/policies/apply", {"gc": gc}, timeout=timeout)

    # -- processes --------------------------------------------------------------

    @overload
    def exec(self, name: str, argv: Iterable[str], stdin: Union[str, bytes, None] = None,
             detach: Literal[False] = False, log: Optional[str] = None, *,
             timeout: Optional[float] = None,
             on_output: Optional[Callable[[str, bytes], None]] = None) -> ExecResult: ...

    @overload
    def exec(self, name: str, argv: Iterable[str], stdin: Union[str, bytes, None], detach: Literal[True],
             log: Optional[str] = None, *, timeout: Optional[float] = None,
             on_output: Optional[Callable[[str, bytes], None]] = None) -> int: ...

    @overload
    def exec(self, name: str, argv: Iterable[str], stdin: Union[str, bytes, None] = None, *,
             detach: Literal[True], log: Optional[str] = None, timeout: Optional[float] = None,
             on_output: Optional[Callable[[str, bytes], None]] = None) -> int: ...

    def exec(self, name: str, argv: Iterable[str], stdin: Union[str, bytes, None] = None,
             detach: bool = False, log: Optional[str] = None, *,
             timeout: Optional[float] = None,
             on_output: Optional[Callable[[str, bytes], None]] = None) -> Union[ExecResult, int]:
        """Run argv in the sandbox. Returns an ExecResult (exit_code, stdout,
        stderr as bytes), or for detach=True the pid of the started process.

        ``on_output(stream, data)`` is called with each piece of output as
        it comes ("stdout" or "stderr"). ``timeout`` bounds the wait for the
        next piece of output or the exit (default: none, since a command may
        be silent for as long as it likes, and the client's default timeout
        does not apply); when it passes, Timeout is raised and the daemon,
        seeing its client gone, sends the command SIGTERM.

        Not retried: a repeat would run the command again. After a
        ConnectionLost the command may have run, partly or whole.
        """
        body: JSON = {"argv": list(argv)}
        if detach:
            body["detach"] = True
            if log:
                body["log"] = log
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin.encode() if isinstance(stdin, str) else stdin).decode()
        p = "/v1/sandboxes/%s/exec" % _q(name)
        t = self._t
        conn, resp = t.retrying("POST", p, False, lambda: t.exchange(
            "POST", p, json.dumps(body).encode(), "application/x-ndjson", timeout))
        try:
            if detach:
                return int(json.loads(t.read(resp.read, "POST", p, timeout))["pid"])
            out: List[bytes] = []
            err: List[bytes] = []
            for frame in _frames(t, resp, "POST", p, timeout):
                if "error" in frame:
                    prob = frame["error"] or {}
                    raise api_error(str(prob.get("detail", "")), None, prob)
                if "exit_code" in frame:
                    return ExecResult(int(frame["exit_code"]), b"".join(out), b"".join(err))
                stream = "stdout" if frame.get("stream") == "stdout" else "stderr"
                data = base64.b64decode(frame.get("data", ""))
                (out if stream == "stdout" else err).append(data)
                if on_output is not None:
                    on_output(stream, data)
            raise ConnectionLost("turnsnap daemon at %s: POST %s: the exec stream of sandbox %s ended without an exit status: "
                                 "the daemon stopped mid-command" % (t.where, p, name),
                                 t.where, "POST", p, request_sent=True)
        finally:
            conn.close()

    # -- events -----------------------------------------------------------------

    def events(self, sandbox: Optional[str] = None, *, timeout: Optional[float] = None,
               last_event_id: Optional[str] = None) -> "EventStream":
        """Subscribe to turn events; iterate the result for them (dicts: type
        started/committed/remote_durable/failed, sandbox, checkpoint, class,
        ...) as they happen. Events after this returns are not missed.

        Subscribing is retried (it is a GET); a broken stream is not
        resumed, since the events in between would be lost unseen: it
        raises ConnectionLost, and ``log()`` tells what happened meanwhile.
        The iteration ends when the daemon stops. ``timeout`` bounds the
        wait for the next event (default: none, as a quiet sandbox is no
        fault; the client's default timeout does not apply); when it
        passes, Timeout is raised. Close the stream (or use it in a with
        block) to unsubscribe. With ``last_event_id`` (an event's "id"), every
        event after it comes first, so a reader that lost its stream resumes
        without a gap; a "gap" event stands for any the daemon no longer has.
        """
        p = "/v1/events" + ("?sandbox=" + _q(sandbox) if sandbox else "")
        t = self._t
        extra = {"Last-Event-ID": last_event_id} if last_event_id else None
        conn, resp = t.retrying("GET", p, True,
                                lambda: t.exchange("GET", p, None, "application/x-ndjson", timeout, extra=extra))
        return EventStream(conn, _frames(t, resp, "GET", p, timeout))


class EventStream:
    """An open subscription to the daemon's events (Client.events): an
    iterator of event dicts, and a context manager that closes it."""

    def __init__(self, conn: http.client.HTTPConnection, frames: Iterator[JSON]) -> None:
        self._conn = conn
        self._frames = frames

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> JSON:
        try:
            return next(self._frames)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unsubscribe: close the connection."""
        self._conn.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, typ: Optional[Type[BaseException]], value: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()


def _frames(t: Transport, resp: http.client.HTTPResponse, method: str, path: str,
            timeout: Optional[float]) -> Iterator[JSON]:
    """The NDJSON objects of a streamed response, failures translated.

    It reads with read1, not readline: on a chunked response http.client's
    readline takes a connection that broke between chunks for the
    stream's end, where read1 raises IncompleteRead. A daemon killed
    mid-stream must not look like one that finished it."""
    buf = b""
    while True:
        nl = buf.find(b"\n")
        if nl < 0:
            more = t.read(lambda: resp.read1(1 << 16), method, path, timeout)
            if not more:
                if buf.strip():
                    raise ConnectionLost("turnsnap daemon at %s: %s %s: the stream ended mid-frame"
                                         % (t.where, method, path), t.where, method, path, request_sent=True)
                return
            buf += more
            continue
        line, buf = buf[:nl], buf[nl + 1:]
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as e:
                raise ConnectionLost("turnsnap daemon at %s: %s %s: a stream frame does not decode: %s"
                                     % (t.where, method, path, e), t.where, method, path, request_sent=True) from e
