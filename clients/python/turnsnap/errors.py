"""The errors the client raises: one hierarchy rooted at :class:`Error`.

Two branches, because a caller reacts to them differently:

- :class:`APIError`: the daemon answered, with an RFC 9457 problem whose
  ``class`` names what went wrong (:class:`NotFound`, :class:`Exists`,
  :class:`Invalid`, :class:`Precondition`, :class:`Unavailable`,
  :class:`Corrupt`, :class:`NoSpace`, :class:`KeyError_`). The request was
  handled; sending it again gets the same answer unless something changes.
- :class:`TransportError`: no complete answer came back
  (:class:`DaemonUnavailable`, :class:`Timeout`, :class:`ConnectionLost`).
  ``request_sent`` says whether the daemon can have seen the request: when
  it is False the request certainly did nothing and may be sent again;
  when True the outcome is unknown (a checkpoint may or may not exist).

Every error has ``klass``, the daemon's class name, and ``exit_code``, the
code the ``turnsnap`` CLI exits with for that class. A transport error is
class ``unavailable`` (exit 6), as the CLI and the Go client report a
daemon they cannot reach.
"""

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "Error", "TurnsnapError", "APIError", "NotFound", "Exists", "Invalid", "Precondition",
    "Unavailable", "Corrupt", "NoSpace", "KeyError_", "TransportError", "DaemonUnavailable",
    "Timeout", "ConnectionLost", "RestoreIncomplete", "EXIT_CODES",
]

#: The CLI's exit code per error class (docs/openapi.yaml; anything else 1).
EXIT_CODES: Mapping[str, int] = {
    "invalid": 2, "not_found": 3, "exists": 4, "precondition": 5,
    "unavailable": 6, "corrupt": 7, "no_space": 8, "key": 9, "restore_incomplete": 11,
}


class Error(Exception):
    """Root of every error this client raises."""

    #: the daemon's error class ("error" when it has none)
    klass: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        #: the whole message, naming the sandbox, checkpoint or socket
        self.message: str = message

    @property
    def exit_code(self) -> int:
        """The code ``turnsnap`` exits with for this class of error."""
        return EXIT_CODES.get(self.klass, 1)


#: The name earlier versions of this client used for :class:`Error`.
TurnsnapError = Error


class APIError(Error):
    """The daemon answered with an error (an RFC 9457 problem)."""

    def __init__(self, message: str, status: Optional[int] = None, klass: Optional[str] = None,
                 problem: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        #: the HTTP status (404, 409, ...), None for an error in a stream
        self.status: Optional[int] = status
        if klass:
            self.klass = klass
        #: the problem object as the daemon sent it (type, title, detail,
        #: class, and exit_code for a command that cannot run)
        self.problem: Dict[str, Any] = dict(problem or {})


class NotFound(APIError):
    """No such sandbox, checkpoint, tag or path (HTTP 404)."""
    klass = "not_found"


class Exists(APIError):
    """It exists already: a sandbox or tag of that name (HTTP 409)."""
    klass = "exists"


class Invalid(APIError):
    """The request is wrong: a bad name, field or combination (HTTP 400)."""
    klass = "invalid"


class Precondition(APIError):
    """The home is not in a state for it: no remote store for a sync,
    a sandbox owned by another home, ... (HTTP 412)."""
    klass = "precondition"


class Unavailable(APIError):
    """The daemon is up but something it needs is not: the store, CRIU,
    runc (HTTP 503). A daemon that cannot be reached at all is
    :class:`DaemonUnavailable` instead."""
    klass = "unavailable"


class Corrupt(APIError):
    """Stored data failed its hash or does not decode (HTTP 422)."""
    klass = "corrupt"


class NoSpace(APIError):
    """A disk or quota is full (HTTP 507)."""
    klass = "no_space"


class KeyError_(APIError):
    """The home's key is missing, wrong or locked (HTTP 403). Named with a
    trailing underscore so as not to shadow the builtin ``KeyError``."""
    klass = "key"


class RestoreIncomplete(APIError):
    """A rollback or branch whose receipt found the sandbox is not the
    checkpoint (HTTP 500): the message names what differs and the state the
    sandbox was left in; ``problem["receipt"]`` has the receipt."""
    klass = "restore_incomplete"


#: Problem class name -> exception type.
API_CLASSES: Mapping[str, Type[APIError]] = {
    c.klass: c for c in (NotFound, Exists, Invalid, Precondition, Unavailable, Corrupt, NoSpace, KeyError_,
                         RestoreIncomplete)
}


def api_error(message: str, status: Optional[int], problem: Mapping[str, Any]) -> APIError:
    """The exception for a problem the daemon sent; an unknown class (a newer
    daemon's) is a plain APIError carrying that class."""
    klass = str(problem.get("class") or "error")
    return API_CLASSES.get(klass, APIError)(message, status=status, klass=klass, problem=dict(problem))


class TransportError(Error):
    """No complete answer came from the daemon."""

    klass = "unavailable"

    def __init__(self, message: str, where: str, method: str, path: str, request_sent: bool,
                 retryable: bool = False) -> None:
        super().__init__(message)
        #: the daemon's address: "socket /var/lib/turnsnap/turnsnap.sock"
        #: or "http://127.0.0.1:7423"
        self.where: str = where
        self.method: str = method
        self.path: str = path
        #: False: the daemon cannot have seen the request (connecting
        #: failed), so it did nothing. True: it may have acted on it.
        self.request_sent: bool = request_sent
        #: whether this kind of failure can pass if the request is sent
        #: again (a restarting daemon, a reset): the client retries it for
        #: requests that are safe to repeat
        self.retryable: bool = retryable
        #: how many times the request was tried, this failure included
        self.attempts: int = 1


class DaemonUnavailable(TransportError):
    """No daemon could be reached: the socket is missing (no daemon serves
    the home), nothing listens on it (a stopped or killed daemon), or the
    host does not answer. The request was not sent."""


class Timeout(TransportError):
    """The daemon did not answer in time: connecting (``phase`` "connect",
    the request was not sent) or waiting for its answer or the next bytes
    of a stream (``phase`` "read": the daemon may still be working on it)."""

    def __init__(self, message: str, where: str, method: str, path: str, request_sent: bool,
                 retryable: bool = False, phase: str = "read", seconds: Optional[float] = None) -> None:
        super().__init__(message, where, method, path, request_sent, retryable)
        self.phase: str = phase
        #: the timeout that passed
        self.seconds: Optional[float] = seconds


class ConnectionLost(TransportError):
    """The connection broke after the request went out: the daemon died or
    restarted mid-request, or cut a response off. Whether the request took
    effect is unknown."""
