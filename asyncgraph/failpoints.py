"""Named failure points for crash tests (etcd's gofail is the model): off unless configured.

Code marks each step of a protocol that a crash or an I/O error could interrupt with
``if failpoints.enabled: failpoints.hit("snapshot.renamed")``. With the environment variable
``ASYNCGRAPH_FAILPOINTS`` unset (production) ``enabled`` is False and the check is one module
attribute read; nothing else runs. Tests and the fault soak set it on the server processes they
start, for instance::

    ASYNCGRAPH_FAILPOINTS="snapshot.renamed=1*off->crash;wal.appended=enospc"

Each entry is ``name=term``; a term is ``[N*]action`` and terms chain with ``->``: the first term
applies to the first ``N`` hits (every hit when ``N`` is left out), then the next term. Actions:

- ``off``: nothing;
- ``crash``: the process ends at once with ``os._exit(CRASH_EXIT)`` (no cleanup, no flush of
  Python buffers: what ``kill -9`` at that instant would leave);
- ``enospc`` / ``eio``: ``OSError`` with that errno is raised at the point;
- ``sleep``: the step waits ``SLEEP_SECONDS`` (a test acting while it runs; ``DELAY_POINTS``).

This module does no I/O besides ``os._exit``; ``hits`` counts the hits per name (for tests run
in-process).
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass

__all__ = [
    "CRASH_EXIT",
    "DELAY_POINTS",
    "ENV",
    "POINTS",
    "SLEEP_SECONDS",
    "START_POINTS",
    "FailpointSpecError",
    "configure",
    "enabled",
    "hit",
    "hits",
]

ENV = "ASYNCGRAPH_FAILPOINTS"
#: Exit status of a ``crash`` action (what a test checks to tell it from another death).
CRASH_EXIT = 86

#: Every failure point the code marks, in protocol order (a name not here is refused).
POINTS: tuple[str, ...] = (
    # a write: logged (crc + frame appended), on disk (fsync), acknowledged
    "wal.before_append",
    "wal.appended",
    "wal.synced",
    "reply.push",
    # a snapshot: epoch checked, rows streamed into snap-<e>.tmp, manifest written and the folder
    # fsynced, renamed to snap-<e>, the next log wal-<e> opened, older snapshots and logs removed,
    # the reply about to go, the reply sent
    "snapshot.begin",
    "snapshot.write_rows",
    "snapshot.rows_written",
    "snapshot.temp_synced",
    "snapshot.renamed",
    "snapshot.log_opened",
    "snapshot.pruned",
    "snapshot.before_ack",
    "reply.snapshot",
    # a connection: the server's hello result sent (a client reconnecting right then)
    "reply.hello",
    # a server rehashing its partition's structure files (--verify, or a config without a
    # recorded fingerprint): tests check that a server trusting the config never does
    "partition.rehash",
)
#: Points hit only while a server starts (not by requests): a crash soak over requests skips them.
START_POINTS: tuple[str, ...] = ("partition.rehash",)

#: Points a test slows (``sleep``) to act while the step runs, for instance a compaction's fold
#: on its worker thread; not in ``POINTS``, which the crash soaks walk.
DELAY_POINTS: tuple[str, ...] = ("compaction.fold",)
SLEEP_SECONDS = 1.0

_ACTIONS = ("off", "crash", "enospc", "eio", "sleep")


class FailpointSpecError(ValueError):
    """``ASYNCGRAPH_FAILPOINTS`` does not parse or names an unknown point."""


@dataclass
class _Term:
    action: str
    times: int | None  # None: every remaining hit


_plan: dict[str, list[_Term]] = {}
hits: dict[str, int] = {}
enabled = False


def _parse(spec: str) -> dict[str, list[_Term]]:
    plan: dict[str, list[_Term]] = {}
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        name, sep, chain = entry.partition("=")
        name = name.strip()
        known = (*POINTS, *DELAY_POINTS)
        if not sep or name not in known:
            raise FailpointSpecError(
                f"{ENV}: {entry!r} is not name=action with a known name ({', '.join(known)})"
            )
        terms = []
        for raw in chain.split("->"):
            count, star, action = raw.strip().rpartition("*")
            if action not in _ACTIONS or (star and not (count.isdigit() and int(count) > 0)):
                raise FailpointSpecError(
                    f"{ENV}: {raw.strip()!r} is not [N*]action with action in {_ACTIONS}"
                )
            terms.append(_Term(action, int(count) if star else None))
        plan[name] = terms
    return plan


def configure(spec: str | None) -> None:
    """Set the failure points from a spec (``None`` or ``""``: none; reads ``ENV`` at import)."""
    global enabled
    _plan.clear()
    hits.clear()
    _plan.update(_parse(spec or ""))
    enabled = bool(_plan)


def hit(name: str) -> None:
    """Run the action configured for ``name`` now (nothing when none is)."""
    terms = _plan.get(name)
    hits[name] = hits.get(name, 0) + 1
    if not terms:
        return
    term = terms[0]
    if term.times is not None:
        term.times -= 1
        if term.times <= 0:
            terms.pop(0)
    if term.action == "crash":
        os._exit(CRASH_EXIT)
    if term.action == "sleep":
        time.sleep(SLEEP_SECONDS)
    if term.action in ("enospc", "eio"):
        code = errno.ENOSPC if term.action == "enospc" else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (failpoint {name})")


configure(os.environ.get(ENV))
