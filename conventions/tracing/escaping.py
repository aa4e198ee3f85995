"""One escaping function for everything from outside that reaches a log line or a
terminal.

A header, a payload field, a worker's name or an exception's message is chosen by
whoever produced the message. Written raw to a text log or an operator's terminal, a
newline forges a log line (``[...: CRITICAL/MainProcess] ...``), an ANSI escape recolours
or rewrites the screen (``ESC[31m``, ``ESC]8;;`` links, a cleared screen), a carriage
return or a backspace hides what came before, and Unicode's bidirectional controls and
line separators reorder or break what the reader sees. :func:`escape` turns each such
character into a visible escape (``\\n``, ``\\x1b``, ``\\u202e``), as JSON does: every C0
and C1 control character, DEL, and the Unicode line, paragraph and direction controls.

The log formats (:mod:`conventions.tracing.logs`) and the command line
(:mod:`conventions.cli.format`) both use it; text without such characters comes back
as it was (one regular-expression search).
"""

from __future__ import annotations

import re
from typing import Final

#: C0 controls, DEL, C1 controls, the Arabic letter mark, the left-to-right and
#: right-to-left marks, line and paragraph separators, direction embeddings, overrides
#: and isolates
_OTHERS: Final = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_ANY: Final = re.compile(f"[\x00-\x1f{_OTHERS}]")
_BUT_NEWLINES: Final = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHERS}]")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(found: re.Match[str]) -> str:
    char = found.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str, *, newlines: bool = True) -> str:
    """``text`` with every control character shown as an escape; ``newlines=False``
    keeps line breaks (a block of several lines: a traceback, indented JSON) and escapes
    the rest."""
    pattern = _ANY if newlines else _BUT_NEWLINES
    if pattern.search(text) is None:
        return text
    return pattern.sub(_visible, text)
