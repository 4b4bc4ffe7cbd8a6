"""The rename rule for Lightning users, as a function: Lightning 2.x source in, phalanx source out.

phalanx promises that a Lightning script runs after exactly these edits and nothing else:

* the package ``lightning.pytorch`` becomes ``phalanx`` (``from lightning.pytorch.callbacks import
  X`` -> ``from phalanx.callbacks import X``; ``import lightning.pytorch as pl`` -> ``import phalanx
  as pl``);
* ``import lightning as L`` -> ``import phalanx as L`` (and ``from lightning import X`` -> ``from
  phalanx import X``: the same package under the other spelling);
* the class names ``LightningModule`` -> ``Module`` and ``LightningDataModule`` -> ``DataModule``.

Only code is rewritten: comments and string literals are left as they are, so a docstring that
mentions Lightning stays true. Anything else that names ``lightning`` (``lightning.fabric``,
``pytorch_lightning``, a bare ``import lightning``) is outside the rule and left unchanged, so a
script that uses it fails loudly instead of silently meaning something else.
"""

from __future__ import annotations

import io
import re
import tokenize

__all__ = ["RULES", "code_tokens", "to_phalanx"]

_NOT_AFTER_NAME = r"(?<![\w.])"
#: (pattern, replacement), applied in order outside comments and strings.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # `lightning.pytorch` as a dotted name, in imports and in qualified uses after `import lightning.pytorch`
    (re.compile(_NOT_AFTER_NAME + r"lightning\s*\.\s*pytorch\b"), "phalanx"),
    # `import lightning as L` (alone or in a comma list) and `from lightning import X`
    (
        re.compile(r"(?m)((?:^|;)\s*import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*)lightning(\s+as\s+\w+)"),
        r"\1phalanx\2",
    ),
    (re.compile(r"(?m)((?:^|;)\s*from\s+)lightning(\s+import\b)"), r"\1phalanx\2"),
    (re.compile(r"\bLightningDataModule\b"), "DataModule"),
    (re.compile(r"\bLightningModule\b"), "Module"),
)

_PROTECTED = {tokenize.COMMENT, tokenize.STRING}
# Python 3.12+ tokenizes f-strings into parts; the literal text of one is FSTRING_MIDDLE.
_PROTECTED |= {getattr(tokenize, name) for name in ("FSTRING_MIDDLE",) if hasattr(tokenize, name)}


def _protected_spans(source: str) -> list[tuple[int, int]]:
    """Character ranges of comments and string literals (the rule does not touch them)."""
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _PROTECTED:
            (row, col), (end_row, end_col) = token.start, token.end
            spans.append((line_starts[row - 1] + col, line_starts[end_row - 1] + end_col))
    return spans


def to_phalanx(source: str) -> str:
    """Apply the rename rule to Python ``source``; raises ``tokenize.TokenError`` on broken source."""
    for pattern, replacement in RULES:
        spans = _protected_spans(source)

        def replace(match: re.Match[str], spans: list[tuple[int, int]] = spans, replacement: str = replacement) -> str:
            if any(start <= match.start() < end for start, end in spans):
                return match.group(0)
            return match.expand(replacement)

        source = pattern.sub(replace, source)
    return source


def code_tokens(source: str) -> list[str]:
    """The NAME tokens of ``source`` (identifiers and keywords: no comments, no strings)."""
    return [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.NAME]
