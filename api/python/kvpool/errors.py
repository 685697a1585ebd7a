"""Errors of the kvpool client: one exception class per sentinel error of the
Go client (package api), mapped to and from gRPC status codes by one table,
CODES, that mirrors api/errors.go's codeTable. A Go test
(test/python_test.go) checks that the two tables agree.

Every error a node reports, over gRPC or in a data-channel status byte,
arrives as the class its code maps to, carrying the node's message; socket
failures arrive as Unavailable (or DeadlineExceeded when the caller's
timeout ran out).
"""

import grpc


class KVPoolError(Exception):
    """Base of every kvpool error. code is the gRPC status code (an int)."""

    code = 13  # Internal unless a subclass says otherwise

    def __init__(self, message=""):
        super().__init__(message or self.__class__.__doc__.strip())
        self.message = message


class NotFound(KVPoolError, KeyError):
    """kvpool: block not found"""

    code = 5

    def __str__(self):  # KeyError's str() would quote the message
        return self.message or "kvpool: block not found"


class AlreadyExists(KVPoolError):
    """kvpool: block exists with different bytes"""

    code = 6


class ResourceExhausted(KVPoolError):
    """kvpool: resource exhausted"""

    code = 8


class InvalidArgument(KVPoolError, ValueError):
    """kvpool: invalid argument"""

    code = 3


class FailedPrecondition(KVPoolError):
    """kvpool: failed precondition"""

    code = 9


class Unavailable(KVPoolError, ConnectionError):
    """kvpool: unavailable"""

    code = 14


class DataLoss(KVPoolError):
    """kvpool: checksum mismatch"""

    code = 15


class Internal(KVPoolError):
    """kvpool: internal error"""

    code = 13


class Unauthenticated(KVPoolError):
    """kvpool: unauthenticated"""

    code = 16


class PermissionDenied(KVPoolError):
    """kvpool: permission denied"""

    code = 7


class Cancelled(KVPoolError):
    """context canceled"""

    code = 1


class DeadlineExceeded(KVPoolError, TimeoutError):
    """context deadline exceeded"""

    code = 4


# The one table: (exception class, gRPC code), in the order of Go's
# codeTable. A code outside it maps to Internal, as in Go.
CODES = [
    (NotFound, 5),
    (AlreadyExists, 6),
    (ResourceExhausted, 8),
    (InvalidArgument, 3),
    (FailedPrecondition, 9),
    (Unavailable, 14),
    (DataLoss, 15),
    (Internal, 13),
    (Unauthenticated, 16),
    (PermissionDenied, 7),
    (Cancelled, 1),
    (DeadlineExceeded, 4),
]

_BY_CODE = {code: cls for cls, code in CODES}


def from_code(code, message=""):
    """The exception for a non-OK gRPC code and the node's message."""
    return _BY_CODE.get(int(code), Internal)(message)


def from_rpc_error(err):
    """Converts a grpc.RpcError into the matching kvpool exception."""
    code = err.code() if hasattr(err, "code") else None
    value = code.value[0] if isinstance(code, grpc.StatusCode) else 13
    details = err.details() if hasattr(err, "details") else str(err)
    return from_code(value, details or "")
