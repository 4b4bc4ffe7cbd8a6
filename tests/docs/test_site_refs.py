"""The docs site's docstring rewriting (docs/_ext/sphinx_roles.py) and its wiring in mkdocs.yml.

The griffe extension turns Sphinx roles and ``docs/*.md`` mentions into links on the API pages.
Its rewriting functions are pure, so they are tested here without mkdocs or griffe; the build
itself (``nox -s docs``, strict) checks that every link it produces resolves.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXT_PATH = ROOT / "docs" / "_ext" / "sphinx_roles.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sphinx_roles", EXT_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sphinx_roles"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


roles = _load()

#: What a documented-package lookup would find: path -> canonical path.
KNOWN = {
    "phalanx.trainer_view.TrainerView": "phalanx.trainer_view.TrainerView",
    "phalanx.Trainer": "phalanx.trainer.trainer.Trainer",
    "phalanx.trainer.trainer.Trainer": "phalanx.trainer.trainer.Trainer",
    "phalanx.trainer.trainer.TrainerConfig": "phalanx.trainer.config.TrainerConfig",
    "phalanx.strategies.strategy.Strategy.setup": "phalanx.strategies.strategy.Strategy.setup",
    "phalanx.strategies.strategy.Strategy": "phalanx.strategies.strategy.Strategy",
    "phalanx.utilities.seed.seed_everything": "phalanx.utilities.seed.seed_everything",
    "phalanx.plugins.entry_points": "phalanx.plugins.entry_points",
}


def _resolver(*, module: str = "phalanx.trainer.trainer", cls: str | None = None) -> roles.Resolver:
    return roles.make_resolver(KNOWN.get, f"{cls or module}", module=module, cls=cls)


def _optional(identifier: str, title: str) -> str:
    return f'<autoref identifier="{identifier}" optional>`{title}`</autoref>'


def test_tilde_shows_the_last_component_and_links_the_full_path() -> None:
    text = roles.rewrite_roles("The :class:`~phalanx.trainer_view.TrainerView` protocol.", _resolver())
    assert text == f"The {_optional('phalanx.trainer_view.TrainerView', 'TrainerView')} protocol."


def test_without_tilde_the_title_is_the_target_and_the_link_is_canonical() -> None:
    text = roles.rewrite_roles("Pass a :class:`phalanx.Trainer`.", _resolver())
    assert text == f"Pass a {_optional('phalanx.trainer.trainer.Trainer', 'phalanx.Trainer')}."


def test_unqualified_names_resolve_in_the_class_then_the_module() -> None:
    in_class = roles.rewrite_roles(
        "Calls :meth:`setup` first.",
        _resolver(module="phalanx.strategies.strategy", cls="phalanx.strategies.strategy.Strategy"),
    )
    assert in_class == f"Calls {_optional('phalanx.strategies.strategy.Strategy.setup', 'setup()')} first."
    in_module = roles.rewrite_roles("A frozen :class:`TrainerConfig`.", _resolver())
    assert in_module == f"A frozen {_optional('phalanx.trainer.config.TrainerConfig', 'TrainerConfig')}."
    relative = roles.rewrite_roles("See :mod:`.entry_points`.", _resolver(module="phalanx.plugins.registry"))
    assert relative == f"See {_optional('phalanx.plugins.entry_points', 'entry_points')}."


def test_unknown_and_non_phalanx_targets_become_inline_code(caplog: pytest.LogCaptureFixture) -> None:
    text = roles.rewrite_roles(
        "Uses :meth:`state_dict`, :class:`torch.nn.Module`, :meth:`logging.Logger.info` and :mod:`random`.",
        _resolver(),
    )
    assert text == "Uses `state_dict()`, `torch.nn.Module`, `logging.Logger.info()` and `random`."
    assert not caplog.records  # not phalanx: nothing to report


def test_a_broken_phalanx_reference_is_a_required_link_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        text = roles.rewrite_roles("A :class:`~phalanx.trainer.config.TrainerConfg`.", _resolver())
    # required (no "optional"): mkdocs-autorefs cannot resolve it, so `mkdocs build --strict` fails
    assert text == "A [`TrainerConfg`][phalanx.trainer.config.TrainerConfg]."
    [record] = caplog.records
    assert record.name.startswith("mkdocs.") and "phalanx.trainer.config.TrainerConfg" in record.getMessage()


def test_explicit_titles_no_link_marks_and_fenced_code() -> None:
    resolve = _resolver()
    text = roles.rewrite_roles(":func:`seed it <phalanx.utilities.seed.seed_everything>`", resolve)
    assert text == _optional("phalanx.utilities.seed.seed_everything", "seed it")
    assert roles.rewrite_roles(":class:`!phalanx.Trainer`", resolve) == "`phalanx.Trainer`"
    assert roles.rewrite_roles(":py:class:`~phalanx.Trainer`", resolve) == _optional(
        "phalanx.trainer.trainer.Trainer", "Trainer"
    )
    fenced = (
        "Before :class:`phalanx.Trainer`.\n\n```python\nx = ':class:`phalanx.Trainer`'\n```\nafter :mod:`random`.\n"
    )
    assert roles.rewrite_roles(fenced, resolve) == (
        f"Before {_optional('phalanx.trainer.trainer.Trainer', 'phalanx.Trainer')}.\n\n"
        "```python\nx = ':class:`phalanx.Trainer`'\n```\nafter `random`.\n"
    )


def test_candidates_follow_sphinx_search_order() -> None:
    assert roles.candidates("fit", module="phalanx.trainer.trainer", cls="phalanx.trainer.trainer.Trainer") == [
        "phalanx.trainer.trainer.Trainer.fit",
        "phalanx.trainer.trainer.fit",
        "fit",
    ]
    assert roles.candidates(".entry_points", module="phalanx.plugins.registry") == [
        "phalanx.plugins.registry.entry_points",
        "phalanx.plugins.entry_points",
    ]


def test_doc_paths_link_to_the_page_titled_with_its_heading() -> None:
    pages = roles.doc_pages(ROOT / "docs")
    assert pages["trainer.md"] == "The Trainer" and pages["reference/trainer.md"] == "Trainer and Module"
    text = roles.rewrite_doc_paths('See docs/trainer.md for each (docs/trainer.md#the-step-pipeline, "x").', pages)
    assert text == 'See [The Trainer](../trainer.md) for each ([The Trainer](../trainer.md#the-step-pipeline), "x").'
    # code and other paths stay; a missing page stays a link, so mkdocs' link check reports it
    assert roles.rewrite_doc_paths("`docs/trainer.md` and site/docs/trainer.md", pages) == (
        "`docs/trainer.md` and site/docs/trainer.md"
    )
    assert roles.rewrite_doc_paths("docs/nope.md", pages) == "[docs/nope.md](../nope.md)"


def test_no_role_in_the_sources_survives_the_rewriting() -> None:
    """Every Sphinx role the docstrings use is one the extension rewrites (else it shows literally)."""
    any_role = re.compile(r":(?:py:)?[a-z]+:`[^`]+`")
    sources = [*ROOT.glob("core/src/**/*.py"), *ROOT.glob("packages/*/src/**/*.py")]
    left = {}
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if roles.ROLE_RE.search(text) is None and any_role.search(text) is None:
            continue
        rewritten = roles.rewrite_roles(text, lambda role, target: None)
        if found := any_role.findall(rewritten):
            left[str(path.relative_to(ROOT))] = found
    assert len(sources) > 50 and not left, f"roles the extension does not rewrite: {left}"


def test_mkdocs_yml_loads_the_extension_and_the_stylesheet() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    handler = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    extensions = handler["handlers"]["python"]["options"]["extensions"]
    assert "docs/_ext/sphinx_roles.py:SphinxRoles" in extensions
    assert hasattr(roles, "SphinxRoles") and (ROOT / "docs" / "_ext" / "sphinx_roles.py").is_file()
    for css in config["extra_css"]:
        assert (ROOT / "docs" / css).is_file(), css
    assert "_ext/" in config["exclude_docs"]  # the extension is not published as a page asset
