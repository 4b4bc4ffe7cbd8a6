"""Turn a jsonargparse parse error into one phalanx error: the key at fault, the closest valid key, the fix.

jsonargparse reports a bad config as a nested tree (the Union it tried, every subtype's failure,
the value given) after a usage block that lists every Trainer argument: correct, but a user has
to dig for the one key that is wrong. :func:`explain` reads that tree and prints the key's full
dotted path (``model.init_args.hiden``), what is wrong with it, the closest valid key, and a
``Fix:`` line, wrapped to the terminal like every other ``phalanx`` error. Messages it does not
recognise are printed as jsonargparse wrote them, with a pointer to ``--help``.

Torch-free and jsonargparse-free: it only reads the message and the parser's keys
(through the parser's public ``known_keys()`` and ``subcommand_names()``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from typing import Any

from phalanx._cli.messages import format_error

__all__ = ["explain", "parser_keys"]

_GROUP = re.compile(r"(?P<kind>Group|Subcommand) '(?P<group>[^']+)' does not accept option '(?P<option>[^']+)'")
_PARSER_KEY = re.compile(r'Parser key "(?P<key>[^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '(?P<cls>[^']+)':\s*\n\s*(?P<reason>[^\n]+)")
_OPTION = re.compile(r"Option '(?P<option>[^']+)' is not accepted")
_EXPECTED = re.compile(r"Expected a (?P<type><[^>]+>|\S+)\. Got value: (?P<value>[^\n]*)")
_SUBTYPES = re.compile(r"Subtypes: \[(?P<types>[^\n]*)\]")
_GIVEN = re.compile(r"Given value: (?P<value>[^\n]*)")
_NOT_ACCESSIBLE = re.compile(r"Expected a path but (?P<path>\S+) either not accessible or invalid")
_REQUIRED = re.compile(r"the following arguments are required: (?P<keys>[^\n]+)")
_UNRECOGNIZED = re.compile(r"[Uu]nrecognized arguments: (?P<args>[^\n]+)")
_TYPE_NAME = re.compile(r"<class '(?:[\w.]*\.)?(?P<name>[^'.]+)'>")


def parser_keys(parser: Any) -> set[str]:
    """Every dotted key ``parser`` accepts (its ``known_keys()``; none for a parser without it)."""
    known = getattr(parser, "known_keys", None)
    return set(known()) if callable(known) else set()


def _subcommand_names(parser: Any) -> set[str]:
    names = getattr(parser, "subcommand_names", None)
    return set(names()) if callable(names) else set()


def _closest(value: str, choices: set[str] | list[str]) -> str | None:
    found = difflib.get_close_matches(value, sorted(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def _type_names(text: str) -> str:
    """``[<class 'int'>, list[pkg.Callback], <class 'NoneType'>]`` as ``int or list[Callback] or None``."""
    short = _TYPE_NAME.sub(lambda m: m.group("name"), text)
    short = re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?P<name>[A-Za-z_]\w*)", r"\g<name>", short).replace("NoneType", "None")
    parts, depth, current = [], 0, ""
    for char in short:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return " or ".join(part for part in parts if part)


def _init_parameters(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s ``__init__`` takes, or ``[]`` when it cannot be imported."""
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
        parameters = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _unknown_key(key: str, near: str | None, listing: str) -> tuple[str, str]:
    problem = f"unknown key {key!r}"
    if near is None:
        return problem, f"remove it, or pick a key from {listing}."
    return f"{problem}; closest match: {near!r}", f"rename it to {near!r} ({listing} lists every key)."


def _diagnose(parser: Any, prog: str, message: str) -> tuple[str, str] | None:
    """(problem, fix) for the messages jsonargparse writes for bad configs, or None if unrecognised."""
    help_hint = f"`{prog} --help`"
    group = _GROUP.search(message)
    if group:
        key = group["option"] if group["kind"] == "Subcommand" else f"{group['group']}.{group['option']}"
        return _unknown_key(key, _closest(key, parser_keys(parser)), help_hint)
    outer = _PARSER_KEY.search(message)
    class_path = _CLASS_PATH.search(message)
    if outer and class_path:
        base, cls = outer["key"], class_path["cls"]
        option = _OPTION.search(message)
        if option:
            key = f"{base}.init_args.{option['option']}"
            near = _closest(option["option"], _init_parameters(cls))
            return _unknown_key(key, f"{base}.init_args.{near}" if near else None, f"`{prog} --{base}.help {cls}`")
        inner = _PARSER_KEY.search(message, class_path.start("reason"))
        expected = _EXPECTED.search(message, class_path.start("reason"))
        if inner and expected:
            key = f"{base}.init_args.{inner['key']}"
            wanted = _type_names(expected["type"])
            problem = f"wrong type for {key!r}: expected {wanted}, got {expected['value']!r}"
            return problem, f"give {key!r} a value of type {wanted} (`{prog} --{base}.help {cls}` lists the types)."
        if (
            _NOT_ACCESSIBLE.search(message)
            or "has no attribute" in class_path["reason"]
            or "No module" in class_path["reason"]
        ):
            problem = f"{base!r}: cannot import {cls!r} ({class_path['reason'].strip()})"
            fix = (
                f"give {base!r} the importable dotted path of a class, e.g. `--{base} mypackage.models.MyClass` "
                "(the current directory is on the import path)."
            )
            return problem, fix
        return f"{base!r}: {class_path['reason'].strip()}", f"see {help_hint}."
    if outer:
        key = outer["key"]
        expected = _EXPECTED.search(message)
        if expected:
            wanted = _type_names(expected["type"])
            problem = f"wrong type for {key!r}: expected {wanted}, got {expected['value']!r}"
            return problem, f"give {key!r} a value of type {wanted} ({help_hint} lists each key's type)."
        subtypes, given = _SUBTYPES.search(message), _GIVEN.search(message)
        if subtypes and given:
            wanted = _type_names(subtypes["types"])
            problem = f"wrong type for {key!r}: expected {wanted}, got {given['value']}"
            return problem, f"give {key!r} a value of type {wanted} ({help_hint} lists each key's type)."
    required = _REQUIRED.search(message)
    if required:
        keys = required["keys"].split(", ")
        subcommand, _, first = keys[0].rpartition(".")
        if subcommand and subcommand in _subcommand_names(parser):
            keys = [k.split(".", 1)[1] for k in keys]
            help_hint = f"`{prog} {subcommand} --help`"
        else:
            first = keys[0]
        problem = f"missing required key{'s' if len(keys) > 1 else ''} {', '.join(repr(k) for k in keys)}"
        return problem, f"give it in the config file (`{first}: ...`) or as `--{first} ...` (see {help_hint})."
    unrecognized = _UNRECOGNIZED.search(message)
    if unrecognized:
        first = unrecognized["args"].split()[0]
        options = {f"--{key}" for key in parser_keys(parser)}
        near = _closest(first, options)
        problem = f"unrecognized arguments: {unrecognized['args']}"
        if near:
            return f"{problem}; closest match: {near!r}", f"use {near!r} (see {help_hint})."
        return problem, f"see {help_hint}."
    return None


def explain(parser: Any, prog: str, message: str) -> str:
    """The error to print for jsonargparse's ``message``: one wrapped error with a ``Fix:`` line.

    Args:
        parser: The parser that failed (its keys give the closest match).
        prog: The command as the user typed it (``"phalanx fit"``).
        message: jsonargparse's message.
    """
    diagnosis = _diagnose(parser, prog, message)
    if diagnosis is None:
        lines = message.strip().splitlines() or ["invalid arguments"]
        text = format_error(f"{prog}: error", lines[0], fix=f"see `{prog} --help`.")
        rest = "\n".join("  " + line for line in lines[1:])
        return f"{text}\n{rest}" if rest else text
    problem, fix = diagnosis
    return format_error(f"{prog}: error", problem, fix=fix)
