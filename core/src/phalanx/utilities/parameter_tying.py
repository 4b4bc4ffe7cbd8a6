"""Tied parameters: find the weights two modules share, and tie them again after they were split.

Moving a model between devices, or loading it shard by shard, can break ties such as an embedding
shared with the output layer (each side gets its own copy). :func:`find_shared_parameters` records
which parameter names point at one tensor; :func:`set_shared_parameters` makes them one again.
"""

from __future__ import annotations

from torch import nn

__all__ = ["find_shared_parameters", "set_shared_parameters"]


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """Groups of two or more dotted parameter names that refer to the same parameter, in registration order."""
    names_by_parameter: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names_by_parameter.setdefault(id(parameter), []).append(name)
    return [names for names in names_by_parameter.values() if len(names) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list[list[str]]) -> nn.Module:
    """Point every name of each group at the group's first parameter; returns ``module``."""
    for group in shared_params:
        reference = module.get_parameter(group[0])
        for name in group[1:]:
            owner_path, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            setattr(owner, attribute, reference)
    return module
