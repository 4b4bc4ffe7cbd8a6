"""How the ``phalanx`` command prints an error: wrapped to the terminal, the fix on its own line.

Error messages are written once, as one sentence-per-clause string, by whoever detects the bad
value (argparse, a registry, the planner), so they can be any length. Wrapping them here, where
the command prints them, keeps every message readable in a 100-column (or narrower) terminal
without every raise site having to know about terminals. The fix is split off so a user scanning
the output finds what to do without reading the whole diagnosis.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from typing import TextIO

__all__ = ["MAX_WIDTH", "format_error", "print_error", "split_fix", "terminal_width"]

#: No message line is longer than this, even in a wide terminal: long lines are hard to read.
MAX_WIDTH = 100
_MIN_WIDTH = 40

#: Where the fix starts: an explicit "Fix:", else the first clause that tells the user what to do.
_FIX_MARKER = re.compile(r"(?:^|(?<=[.;:)])\s+)(?:fix:\s*)", re.IGNORECASE)
_IMPERATIVE = re.compile(
    r"(?<=[.;])\s+(?=(?:pass|choose|pick|install|reinstall|uninstall|upgrade|run|use|set|unset|name|check|give|"
    r"remove|delete|add|try|see|resume|convert|define|subclass|block)\b)",
    re.IGNORECASE,
)
#: Spans wrapping must not break: a `quoted command` and a ``pip install ...`` command.
_UNBREAKABLE = re.compile(r"`[^`]*`|pip install(?: -\S+)*(?: '[^']*'| \S+)")
_GLUE = "\x00"


def terminal_width() -> int:
    """The terminal's columns, capped at :data:`MAX_WIDTH` (100 when output is not a terminal)."""
    return max(_MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def split_fix(message: str) -> tuple[str, str | None]:
    """``message`` as (what is wrong, what to do); the fix is ``None`` when the message has none.

    The fix starts at an explicit ``Fix:`` or, failing that, at the first clause after a ``.`` or
    ``;`` that starts with an imperative verb ("Pass ...", "choose ...", "install ...").
    """
    text = " ".join(message.split())
    marker = _FIX_MARKER.search(text)
    if marker is None:
        marker = _IMPERATIVE.search(text)
    if marker is None:
        return text, None
    problem = text[: marker.start()].rstrip(" ;")
    fix = text[marker.end() :].strip()
    if not fix:
        return text, None
    if len(fix) > 1 and fix[1].islower():
        fix = fix[0].lower() + fix[1:]
    return problem, fix


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """Word-wrap ``text``; a backquoted span or a ``pip install`` command is never split."""
    glued = _UNBREAKABLE.sub(lambda found: found.group(0).replace(" ", _GLUE), text)
    lines = textwrap.wrap(
        glued,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_GLUE, " ") for line in lines] or [first.rstrip()]


def format_error(prefix: str, message: str, *, fix: str | None = None, width: int | None = None) -> str:
    """``prefix: message`` wrapped at word boundaries, then ``Fix: ...`` on a line of its own.

    Args:
        prefix: Who complains, e.g. ``"phalanx plan: error"``.
        message: The whole message; its fix is split off by :func:`split_fix`.
        fix: A fix to use when ``message`` carries none (e.g. "see `phalanx plan --help`").
        width: Columns to fit; default :func:`terminal_width`.
    """
    width = width or terminal_width()
    problem, found = split_fix(message)
    fix = found or fix
    lines = _wrap(problem, width, f"{prefix}: ", "  ")
    if fix:
        lines += _wrap(fix, width, "  Fix: ", "       ")
    return "\n".join(lines)


def print_error(prefix: str, message: str, *, fix: str | None = None, file: TextIO | None = None) -> None:
    """Print :func:`format_error` to ``file`` (stderr by default)."""
    print(format_error(prefix, message, fix=fix), file=file or sys.stderr)
