"""``phalanx_ray.fit`` refuses bad arguments before anything starts on a cluster, naming the fix."""

from __future__ import annotations

import pytest

import phalanx_ray
from phalanx.errors import MisconfigurationError


def _module() -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, r"num_workers=0\) must be a positive int.*Fix: pass e.g. num_workers=2"),
        ({"num_workers": True}, r"num_workers=True\) must be a positive int"),
        (
            {"num_workers": 2, "max_failures": -2},
            r"max_failures=-2\) must be an int >= -1.*Fix: pass e.g. max_failures=2",
        ),
        (
            {"num_workers": 2, "build_data": [1, 2]},
            r"build_data=\[1, 2\]\) must be a function that builds it on each worker",
        ),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(MisconfigurationError, match=message):
        phalanx_ray.fit(_module, **kwargs)


def test_a_module_instead_of_a_function_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"build_module=.* must be a function"):
        phalanx_ray.fit(object(), num_workers=2)  # type: ignore[arg-type]
