"""What every command-line tool shares: one-line errors with exit status 2, DGL-style
underscore aliases (``--num_trainers`` for ``--num-trainers``), ``--log-level``.

``Parser`` is an ``argparse.ArgumentParser`` whose usage errors are one line on stderr (not the
usage block) and whose ``--long-option`` spellings are also accepted with underscores (hidden
from ``--help``, which shows the dashed form). ``run_main`` turns the errors a tool expects from
its input (a missing file, a malformed config, a bad partition id: ``OSError``, ``ValueError``,
asyncgraph's ``InvalidRequestError``) into ``prog: error: <message>`` and status 2, never a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = [
    "LOG_LEVELS",
    "CliError",
    "Parser",
    "configure_logging",
    "one_line",
    "part_config_checked",
    "run_main",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class CliError(Exception):
    """Bad input a tool reports as one line with exit status ``status`` (default 2)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class _AliasHelp(argparse.HelpFormatter):
    """Leaves the underscore aliases out of ``--help``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if action.option_strings:
            shown = [s for s in action.option_strings if not (s.startswith("--") and "_" in s)]
            action = argparse.Action(shown or action.option_strings, action.dest, nargs=action.nargs,
                                     metavar=action.metavar)  # fmt: skip
        return super()._format_action_invocation(action)


class _AliasRawHelp(_AliasHelp, argparse.RawDescriptionHelpFormatter):
    pass


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` with one-line errors, underscore aliases and a ``--log-level``."""

    def __init__(
        self, *args: Any, raw_description: bool = False, log_level: bool = True, **kwargs: Any
    ) -> None:
        kwargs.setdefault("formatter_class", _AliasRawHelp if raw_description else _AliasHelp)
        super().__init__(*args, **kwargs)
        if log_level:
            self.add_argument(
                "--log-level",
                default="INFO",
                type=str.upper,
                choices=LOG_LEVELS,
                help="logging threshold on stderr (default INFO)",
            )

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*_with_aliases(names), **kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        group = super().add_argument_group(*args, **kwargs)
        plain = group.add_argument

        def add(*names: Any, **kw: Any) -> argparse.Action:
            return plain(*_with_aliases(names), **kw)

        group.add_argument = add  # type: ignore[method-assign]
        return group

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"/--\w*_[\w_]*", "", message)  # "--part-id/--part_id": name it once
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _with_aliases(names: Sequence[Any]) -> list[Any]:
    out = list(names)
    for name in names:
        if isinstance(name, str) and name.startswith("--") and "-" in name[2:]:
            alias = "--" + name[2:].replace("-", "_")
            if alias not in out:
                out.append(alias)
    return out


def configure_logging(level: str, prefix: str) -> None:
    """Log records at ``level`` and above to stderr as ``time prefix LEVEL message``."""
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s {prefix} %(levelname)s %(message)s", stream=sys.stderr
    )


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first line, or its type when it has no message."""
    text = str(exc).strip()
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.strerror}: {exc.filename}"
    first = text.splitlines()[0] if text else type(exc).__name__
    for source in (exc, exc.__cause__):  # pydantic's first line only counts the errors
        errors = getattr(source, "errors", None)
        if callable(errors) and "validation error" in first:
            try:
                detail = errors()[0]
                where = ".".join(str(p) for p in detail.get("loc", ())) or "input"
                return f"{first.split(':')[0]}: {where}: {detail.get('msg', '')}"
            except (TypeError, IndexError, AttributeError):
                break
    return first


def part_config_checked(path: Any, part_id: int | None = None) -> Any:
    """The ``PartitionConfig`` at ``path`` (and ``part_id`` in range), else ``CliError``."""
    from pathlib import Path

    from asyncgraph.partition.config import PartitionConfig

    path = Path(path)
    if not path.is_file():
        raise CliError(f"partition config {path} does not exist")
    from asyncgraph.errors import ForeignPartitionError

    try:
        config = PartitionConfig.load(path)
    except ForeignPartitionError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(f"partition config {path} is invalid: {one_line(exc)}") from None
    if part_id is not None and not 0 <= part_id < config.num_parts:
        raise CliError(f"--part-id {part_id} out of range: {path} has partitions 0..{config.num_parts - 1}")
    return config


def run_main(prog: str, main: Callable[[], int | None]) -> int:
    """Run ``main``; expected input errors become ``prog: error: ...`` on stderr and status 2."""
    from asyncgraph.errors import InvalidRequestError

    try:
        return main() or 0
    except CliError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return exc.status
    except (OSError, ValueError, InvalidRequestError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
