"""Typed exceptions shared by every layer.

Every error a server reports travels as ``(code, message)``; the client turns the code back
into the matching class below, so callers can ``except OutOfRangeError`` whether they talk to a
server or to the in-process standalone store.
"""

from __future__ import annotations


class AsyncGraphError(Exception):
    """Base class of every error raised by asyncgraph."""

    code: str = "internal"


class InvalidRequestError(AsyncGraphError, ValueError):
    """The request is malformed or does not fit the stored data; nothing was changed."""

    code = "invalid_request"


class OutOfRangeError(InvalidRequestError, IndexError):
    """An ID lies outside the range owned by the partition (or the graph)."""

    code = "out_of_range"


class DTypeMismatchError(InvalidRequestError, TypeError):
    """Values or IDs have a dtype the tensor or op does not accept."""

    code = "bad_dtype"


class ShapeMismatchError(InvalidRequestError):
    """Values have a row shape or length that does not match the tensor or the IDs."""

    code = "bad_shape"


class UnknownTensorError(InvalidRequestError, KeyError):
    """No tensor of that name exists."""

    code = "unknown_tensor"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TensorExistsError(InvalidRequestError):
    """A tensor of that name exists with another shape, dtype or partition policy."""

    code = "tensor_exists"


class PartialTensorError(InvalidRequestError):
    """A tensor exists on some partitions but not on others (e.g. after a restart without state)."""

    code = "partial_tensor"


class UnknownOpError(InvalidRequestError):
    """The server does not know the requested operation."""

    code = "unknown_op"


class UnknownTypeError(InvalidRequestError, KeyError):
    """A node or edge type (or a dict keyed by types) names a type the graph does not have."""

    code = "unknown_type"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NonFiniteError(InvalidRequestError):
    """Gradients (or the update they make) hold NaN or infinity; nothing was applied."""

    code = "non_finite"


class ReadOnlyTensorError(InvalidRequestError, PermissionError):
    """A write, delete or optimizer step on a tensor this server keeps read-only (the
    partition's own data, or optimizer state); the message names the tensor and the option."""

    code = "read_only"


class TooManyTensorsError(InvalidRequestError):
    """A server already holds as many tensors as it allows (``--max-tensors``); nothing created."""

    code = "too_many_tensors"


class MemoryBudgetError(InvalidRequestError):
    """A new tensor would take a server past its memory budget for tensors (``--memory-budget``),
    or a read a client past the bytes it allows one read (PyG's ``DistFeatureStore``)."""

    code = "memory_budget"


class InvalidNameError(InvalidRequestError):
    """A tensor, holder or barrier name is too long or not printable (``protocol.args.MAX_NAME_BYTES``)."""

    code = "bad_name"


class ForeignPartitionError(InvalidRequestError):
    """A partition config written by another system (DGL's ``partition_graph``): asyncgraph
    cannot serve it; the original graph must be partitioned with asyncgraph's partitioner."""

    code = "foreign_partition"


class UnknownEdgeError(OutOfRangeError):
    """An edge ID names no live edge: never added, or removed (``remove_edges``, ``find_edges``)."""

    code = "unknown_edge"


class DuplicateEdgeError(InvalidRequestError):
    """``add_edges`` of an edge that exists (or twice in one call) on a graph partitioned with
    ``multigraph=False``: nothing was added."""

    code = "duplicate_edge"


class NodeTypeMismatchError(InvalidRequestError):
    """An edge of a heterogeneous graph joins nodes of other types than its relation names
    (``add_edges(src, dst, etype=("author", "writes", "paper"))`` with a ``src`` that is no author)."""

    code = "node_type_mismatch"


class LiveGraphError(InvalidRequestError):
    """The op has no form that reads a live graph's overlay yet (added or removed edges), so it
    is refused rather than answered from the partition's original structure."""

    code = "live_graph"


class PartitionFileError(InvalidRequestError):
    """A partition file cannot be served as stored: a wrong size, an ``.npy`` header that
    disagrees with the config, or a layout that cannot be mapped (Fortran order, foreign byte
    order); a server refuses to start on it (issue 34)."""

    code = "bad_partition_file"


class FingerprintMismatchError(PartitionFileError):
    """``--verify``: the partition's structure files do not hash to the fingerprint its
    config records (a flipped byte, a file from another partitioning)."""

    code = "fingerprint_mismatch"


class ProtocolError(AsyncGraphError):
    """Bytes on the wire do not form a valid frame or message."""

    code = "protocol"


class FrameTooLargeError(ProtocolError):
    """A frame's declared length exceeds the configured maximum."""

    code = "frame_too_large"


class AuthenticationError(AsyncGraphError, PermissionError):
    """The handshake failed: wrong secret, protocol version or graph name."""

    code = "auth"


class HolderError(InvalidRequestError, PermissionError):
    """A request named a holder other than the one its connection's hello bound (issue 32), or
    a holder name that is too long or not printable; nothing was changed."""

    code = "holder"


class ReplicaProofError(InvalidRequestError, PermissionError):
    """``add_replica`` from a server that did not prove it is a replica of this partition on
    this host (the secret, the partition's fingerprint, this primary's memory); not listed."""

    code = "replica_unproven"


class RequestTimeoutError(AsyncGraphError, TimeoutError):
    """A call did not complete within its timeout."""

    code = "timeout"


class BarrierTimeoutError(RequestTimeoutError):
    """A barrier was not released in time; the message says how many clients arrived."""

    code = "barrier_timeout"


class StateLogError(AsyncGraphError):
    """The server could not log a write to its write-ahead log (disk full, I/O error).

    The write may be applied in memory but is not durable, so the server refuses every later
    write until it is restarted from its state (reads are still served); the message names the
    OS error.
    """

    code = "state_log_failed"


class SnapshotFailedError(AsyncGraphError):
    """A snapshot could not be written (an I/O error in the state folder): its partial files were
    removed and nothing changed (the server's epoch and write-ahead log are as before, writes go
    on), so the same snapshot may be asked for again once the cause is fixed."""

    code = "snapshot_failed"


class StorageFullError(SnapshotFailedError):
    """A snapshot found the state folder's disk (or quota) full (ENOSPC, EDQUOT); as for every
    ``SnapshotFailedError`` its partial files were removed and nothing changed."""

    code = "storage_full"


class OverloadedError(AsyncGraphError):
    """A serving process's queue is full (``--queue-limit``): retry later, ideally with backoff
    (HTTP 429). Nothing was computed for the request."""

    code = "overloaded"


class UnknownModelError(InvalidRequestError, KeyError):
    """A request names a model the serving process does not serve (HTTP 404)."""

    code = "unknown_model"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ServerUnavailableError(AsyncGraphError, ConnectionError):
    """A server is unreachable or went away; the message names the server."""

    code = "unavailable"


class ServersMissingError(ServerUnavailableError):
    """Some servers were still unreachable when the connect deadline passed.

    ``missing`` lists ``(part_id, "host:port", last error)`` for each of them.
    """

    code = "servers_missing"

    def __init__(self, message: str, missing: list[tuple[int, str, str]] | None = None) -> None:
        super().__init__(message)
        self.missing = missing or []


_BY_CODE: dict[str, type[AsyncGraphError]] = {
    cls.code: cls
    for cls in (
        AsyncGraphError,
        InvalidRequestError,
        OutOfRangeError,
        DTypeMismatchError,
        ShapeMismatchError,
        UnknownTensorError,
        TensorExistsError,
        PartialTensorError,
        UnknownOpError,
        UnknownTypeError,
        NonFiniteError,
        ReadOnlyTensorError,
        TooManyTensorsError,
        MemoryBudgetError,
        InvalidNameError,
        ForeignPartitionError,
        UnknownEdgeError,
        NodeTypeMismatchError,
        DuplicateEdgeError,
        LiveGraphError,
        PartitionFileError,
        FingerprintMismatchError,
        ProtocolError,
        FrameTooLargeError,
        AuthenticationError,
        HolderError,
        ReplicaProofError,
        RequestTimeoutError,
        BarrierTimeoutError,
        StateLogError,
        SnapshotFailedError,
        StorageFullError,
        ServerUnavailableError,
        ServersMissingError,
        OverloadedError,
        UnknownModelError,
    )
}


def error_from_code(code: str, message: str) -> AsyncGraphError:
    """Rebuild the typed exception a server reported as ``(code, message)``."""
    return _BY_CODE.get(code, AsyncGraphError)(message)


def error_code(exc: BaseException) -> str:
    """The wire code for an exception (``internal`` for anything not ours)."""
    return exc.code if isinstance(exc, AsyncGraphError) else "internal"
