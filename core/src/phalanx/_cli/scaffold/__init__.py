"""Templates of ``phalanx new``: one folder per plugin kind, files rendered with string.Template.

A file's path under its kind's folder is its path in the generated package, with ``__module__``
replaced by the package's import name and a trailing ``.tmpl`` dropped (so the templates are not
collected, linted or imported as this package's own modules).
"""

from __future__ import annotations

__all__: list[str] = []
