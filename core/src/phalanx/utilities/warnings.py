"""Warnings that may be false alarms, and the switch that silences them.

Some of phalanx's warnings describe a setup that is *often* a mistake but can be deliberate, such
as a DataLoader with few workers. They are :class:`PossibleUserWarning` (Lightning's category), so
a user who knows their setup is right turns them all off with :func:`disable_possible_user_warnings`
instead of filtering messages one by one. Torch-free.
"""

from __future__ import annotations

import warnings

__all__ = ["PossibleUserWarning", "disable_possible_user_warnings"]


class PossibleUserWarning(UserWarning):
    """A warning about a setup that is usually, but not always, a mistake."""


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore every :class:`PossibleUserWarning`, or only those raised from modules matching ``module``.

    ``module`` is a regular expression matched against the warning's module name, as in
    :func:`warnings.filterwarnings` (e.g. ``"phalanx.trainer"``); empty means everywhere.
    """
    warnings.filterwarnings("ignore", module=module, category=PossibleUserWarning)
