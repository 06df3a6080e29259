"""Python client of the turnsnap daemon (``turnsnap serve``).

Standard library only. It speaks the daemon's HTTP API (docs/openapi.yaml)
over the home's unix socket, or over TCP with a bearer token::

    from turnsnap import Client
    c = Client()                                  # /var/lib/turnsnap/turnsnap.sock
    c = Client(socket="/srv/ts/turnsnap.sock")
    c = Client(url="http://127.0.0.1:7423", token="...")
    cp = c.checkpoint("agent1", turn=3, message="tests pass")
    c.rollback("agent1", cp["parent"])

Results are the JSON objects ``turnsnap ... --json`` prints. Every failure
raises a subclass of :class:`Error`: :class:`APIError` when the daemon
answered with a problem (NotFound, Exists, Invalid, Precondition,
Unavailable, Corrupt, NoSpace, KeyError_), :class:`TransportError` when no
answer came (DaemonUnavailable, Timeout, ConnectionLost). Requests that are
safe to repeat are retried after transport failures (:class:`Retry`);
README.md says which, and why.
"""

from ._transport import DEFAULT, NO_RETRY, Retry, RetryEvent, TimeoutArg
from .client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Client, EventStream, ExecResult
from .errors import (EXIT_CODES, APIError, ConnectionLost, Corrupt, DaemonUnavailable, Error, Exists, Invalid,
                     KeyError_, NoSpace, NotFound, Precondition, RestoreIncomplete, Timeout, TransportError, TurnsnapError, Unavailable)

__all__ = [
    "Client", "ExecResult", "EventStream", "Retry", "RetryEvent", "NO_RETRY", "DEFAULT", "TimeoutArg",
    "DEFAULT_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT",
    "Error", "TurnsnapError", "APIError", "NotFound", "Exists", "Invalid", "Precondition", "Unavailable",
    "Corrupt", "NoSpace", "KeyError_", "RestoreIncomplete", "TransportError", "DaemonUnavailable", "Timeout", "ConnectionLost",
    "EXIT_CODES",
]
