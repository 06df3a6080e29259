"""Python client of the turnsnap daemon (``turnsnap serve``).

Standard library only. It speaks the daemon's HTTP API (docs/openapi.yaml)
over the home's unix socket, or over TCP with a bearer token::

    from turnsnap import Client
    c = Client()                                  # /var/lib/turnsnap/turnsnap.sock
    c = Client(socket="/srv/ts/turnsnap.sock")
    c = Client(url="http://127.0.0.1:7423", token="...")
    cp = c.checkpoint("agent1", turn=3, message="tests pass")
    c.rollback("agent1", cp["parent"])

Results are the JSON objects ``turnsnap ... --json`` prints. A failed
request raises TurnsnapError (a subclass per error class: NotFound,
Exists, Invalid, Precondition, Unavailable, Corrupt, NoSpace, KeyError_),
whose ``klass`` is the class the CLI maps to its exit code.
"""

import base64
import http.client
import json
import os
import socket
import urllib.parse

__all__ = ["Client", "TurnsnapError", "NotFound", "Exists", "Invalid", "Precondition",
           "Unavailable", "Corrupt", "NoSpace", "KeyError_", "ExecResult"]


class TurnsnapError(Exception):
    """An error the daemon reported (an RFC 9457 problem)."""

    klass = "error"

    def __init__(self, message, status=None, klass=None):
        super().__init__(message)
        self.message = message
        self.status = status
        if klass:
            self.klass = klass


class NotFound(TurnsnapError):
    klass = "not_found"


class Exists(TurnsnapError):
    klass = "exists"


class Invalid(TurnsnapError):
    klass = "invalid"


class Precondition(TurnsnapError):
    klass = "precondition"


class Unavailable(TurnsnapError):
    klass = "unavailable"


class Corrupt(TurnsnapError):
    klass = "corrupt"


class NoSpace(TurnsnapError):
    klass = "no_space"


class KeyError_(TurnsnapError):
    klass = "key"


_CLASSES = {c.klass: c for c in (NotFound, Exists, Invalid, Precondition, Unavailable, Corrupt, NoSpace, KeyError_)}


class ExecResult:
    """A finished exec: its exit code and output."""

    def __init__(self, exit_code, stdout, stderr):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self):
        return "ExecResult(exit_code=%d, stdout=%r, stderr=%r)" % (self.exit_code, self.stdout, self.stderr)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("turnsnap", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def _q(s):
    return urllib.parse.quote(s, safe="")


class Client:
    """A client of one daemon. Give a socket path, or a URL and a token;
    with neither, the socket of $TURNSNAP_HOME (default /var/lib/turnsnap)."""

    def __init__(self, socket=None, url=None, token=None, timeout=None):
        if socket and url:
            raise ValueError("give a socket or a url, not both")
        #: the unix socket this client uses (None over TCP)
        self.socket_path = None
        if url:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise ValueError("url must be http://HOST:PORT or https://HOST:PORT")
            self._new = lambda: (http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection)(
                u.netloc, timeout=timeout)
        else:
            path = socket or os.path.join(os.environ.get("TURNSNAP_HOME", "/var/lib/turnsnap"), "turnsnap.sock")
            self.socket_path = path
            self._new = lambda: _UnixConnection(path, timeout)
        self._token = token

    # -- transport --------------------------------------------------------

    def _headers(self, accept="application/json"):
        h = {"Accept": accept, "Content-Type": "application/json"}
        if self._token:
            h["Authorization"] = "Bearer " + self._token
        return h

    @staticmethod
    def _raise(resp):
        data = resp.read()
        try:
            p = json.loads(data)
            msg, klass = p.get("detail") or data.decode(errors="replace"), p.get("class", "error")
        except ValueError:
            msg, klass = data.decode(errors="replace").strip() or resp.reason, "unavailable"
        raise _CLASSES.get(klass, TurnsnapError)(msg, status=resp.status, klass=klass)

    def _open(self, method, path, body=None, accept="application/json"):
        conn = self._new()
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=payload, headers=self._headers(accept))
        resp = conn.getresponse()
        if resp.status != 200:
            try:
                self._raise(resp)
            finally:
                conn.close()
        return conn, resp

    def _call(self, method, path, body=None):
        conn, resp = self._open(method, path, body)
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    # -- sandboxes --------------------------------------------------------

    def create_sandbox(self, name, base, backend=None, btrfs_pool=None):
        body = {"name": name, "base": os.path.abspath(base)}
        if backend:
            body["backend"] = backend
        if btrfs_pool:
            body["btrfs_pool"] = os.path.abspath(btrfs_pool)
        return self._call("POST", "/v1/sandboxes", body)

    def sandboxes(self):
        return self._call("GET", "/v1/sandboxes")

    def sandbox(self, name):
        return self._call("GET", "/v1/sandboxes/" + _q(name))

    def sandbox_path(self, name):
        return self._call("POST", "/v1/sandboxes/%s/mount" % _q(name))["root"]

    def remove_sandbox(self, name):
        return self._call("DELETE", "/v1/sandboxes/" + _q(name))

    # -- turns ------------------------------------------------------------

    def checkpoint(self, name, turn=None, message=None, wait_remote=False):
        """Close a turn; returns what `turnsnap checkpoint --json` prints."""
        body = {}
        if turn is not None:
            body["turn"] = turn
        if message:
            body["message"] = message
        if wait_remote:
            body["wait_remote"] = True
        return self._call("POST", "/v1/sandboxes/%s/checkpoints" % _q(name), body)

    def log(self, name):
        return self._call("GET", "/v1/sandboxes/%s/checkpoints" % _q(name))

    def get_checkpoint(self, ref):
        return self._call("GET", "/v1/checkpoints/" + _q(ref))

    def diff(self, name, frm=None, to=None):
        q = {k: v for k, v in (("from", frm), ("to", to)) if v}
        path = "/v1/sandboxes/%s/diff" % _q(name)
        return self._call("GET", path + ("?" + urllib.parse.urlencode(q) if q else ""))

    def rollback(self, name, checkpoint, fs_only=False):
        return self._call("POST", "/v1/sandboxes/%s/rollback" % _q(name), {"checkpoint": checkpoint, "fs_only": fs_only})

    def abandon_rollback(self, name):
        """Discard the sandbox's interrupted rollback instead of finishing it:
        the root goes back to the head."""
        return self._call("POST", "/v1/sandboxes/%s/rollback" % _q(name), {"abandon": True})

    def branch(self, checkpoint, name, count=None, fs_only=False):
        """New sandbox(es) from a checkpoint; with count, NAME-1 ... NAME-count.
        Returns the list of restores."""
        body = {"name": name, "fs_only": fs_only}
        if count:
            body["count"] = count
        return self._call("POST", "/v1/checkpoints/%s/branches" % _q(checkpoint), body)

    def verify(self, ref):
        return self._call("POST", "/v1/checkpoints/%s/verify" % _q(ref))

    def tag(self, tag, checkpoint):
        return self._call("PUT", "/v1/tags/" + _q(tag), {"checkpoint": checkpoint})

    def tags(self):
        return self._call("GET", "/v1/tags")

    def status(self):
        return self._call("GET", "/v1/status")

    def sync(self, sandbox=None):
        return self._call("POST", "/v1/sync", {"sandbox": sandbox} if sandbox else {})

    # -- paths, lineage, retention (the everyday commands) -----------------

    def cat(self, ref, path):
        """The bytes of the file at path as it was in checkpoint ref. A file
        the daemon could not read whole (a damaged chunk mid-file) raises
        Unavailable: the daemon cuts the stream off, so a partial file is
        never returned as a whole one (`turnsnap cat` says which object)."""
        conn, resp = self._open("GET", "/v1/checkpoints/%s/content?path=%s" % (_q(ref), urllib.parse.quote(path, safe="")),
                                accept="application/octet-stream")
        try:
            return resp.read()
        except (http.client.IncompleteRead, ConnectionError) as e:
            raise Unavailable("cat of %s in checkpoint %s: the daemon cut the file off (a damaged chunk?): %r"
                              % (path, ref, e), klass="unavailable")
        finally:
            conn.close()

    def ls(self, ref, path="/"):
        return self._call("GET", "/v1/checkpoints/%s/entries?path=%s" % (_q(ref), urllib.parse.quote(path, safe="")))

    def restore(self, name, checkpoint, paths):
        """Put paths back into the sandbox as they were in checkpoint."""
        return self._call("POST", "/v1/sandboxes/%s/restore" % _q(name), {"checkpoint": checkpoint, "paths": list(paths)})

    def lineage(self):
        """Every checkpoint of the home, children before parents (log --all)."""
        return self._call("GET", "/v1/lineage")

    def ps(self, name):
        return self._call("GET", "/v1/sandboxes/%s/ps" % _q(name))

    def forget(self, sandbox=None, all=False, dry_run=False, gc=False, **policy):
        """Delete the checkpoints a policy (keep_last=N, keep_daily=N, ...)
        does not keep, of one sandbox or, with all=True, every one."""
        body = {"policy": policy, "dry_run": dry_run, "gc": gc}
        if sandbox:
            body["sandbox"] = sandbox
        if all:
            body["all"] = True
        return self._call("POST", "/v1/forget", body)

    def policies(self, sandbox=None):
        return self._call("GET", "/v1/policies" + ("?sandbox=" + _q(sandbox) if sandbox else ""))

    def set_policy(self, sandbox=None, **policy):
        body = {"policy": policy}
        if sandbox:
            body["sandbox"] = sandbox
        return self._call("PUT", "/v1/policies", body)

    def clear_policy(self, sandbox=None):
        return self._call("DELETE", "/v1/policies" + ("?sandbox=" + _q(sandbox) if sandbox else ""))

    def apply_policies(self, gc=False):
        return self._call("POST", "/v1/policies/apply", {"gc": gc})

    # -- processes --------------------------------------------------------

    def exec(self, name, argv, stdin=None, detach=False, log=None):
        """Run argv in the sandbox. Returns an ExecResult (exit_code, stdout,
        stderr as bytes), or for detach=True the pid of the started process."""
        body = {"argv": list(argv)}
        if detach:
            body["detach"] = True
            if log:
                body["log"] = log
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin.encode() if isinstance(stdin, str) else stdin).decode()
        conn, resp = self._open("POST", "/v1/sandboxes/%s/exec" % _q(name), body, accept="application/x-ndjson")
        try:
            if detach:
                return json.loads(resp.read())["pid"]
            out, err = [], []
            for line in resp:
                frame = json.loads(line)
                if "error" in frame:
                    p = frame["error"]
                    raise _CLASSES.get(p.get("class"), TurnsnapError)(p.get("detail", ""), p.get("status"), p.get("class"))
                if "exit_code" in frame:
                    return ExecResult(frame["exit_code"], b"".join(out), b"".join(err))
                (out if frame.get("stream") == "stdout" else err).append(base64.b64decode(frame.get("data", "")))
            raise Unavailable("exec stream ended without an exit status")
        finally:
            conn.close()

    # -- events -----------------------------------------------------------

    def events(self, sandbox=None):
        """Yield turn events (dicts: type started/committed/remote_durable/
        failed, sandbox, checkpoint, class, ...) as they happen."""
        path = "/v1/events" + ("?sandbox=" + _q(sandbox) if sandbox else "")
        conn, resp = self._open("GET", path, accept="application/x-ndjson")
        try:
            for line in resp:
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()
