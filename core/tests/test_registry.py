"""Runtime registration with Lightning's signature, lazy targets, and the error messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from phalanx.errors import MisconfigurationError, PluginUnavailableError, UnknownNameError
from phalanx.registry import AcceleratorRegistry, PrecisionRegistry, Registry, StrategyRegistry


class Toy:
    """A toy component. Second line is not part of the description."""

    def __init__(self, size: int = 1, colour: str = "red") -> None:
        self.size = size
        self.colour = colour


@pytest.fixture
def registry() -> Iterator[Registry]:
    yield Registry("widget")


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        if name in StrategyRegistry:
            StrategyRegistry.remove(name)


def test_lightning_signature_register_get_remove(cleanup: list[str]) -> None:
    cleanup.append("toy_strategy")
    StrategyRegistry.register("toy_strategy", Toy, description="A toy", size=3)
    assert "toy_strategy" in StrategyRegistry
    assert "toy_strategy" in StrategyRegistry.available_strategies()
    toy = StrategyRegistry.get("toy_strategy")
    assert isinstance(toy, Toy) and toy.size == 3
    assert StrategyRegistry.entry("toy_strategy").source.plugin == "<runtime>"
    StrategyRegistry.remove("toy_strategy")
    assert "toy_strategy" not in StrategyRegistry


def test_custom_checkpoint_io_registration_like_the_expert_guide(cleanup: list[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    from phalanx.checkpoint_io import TorchCheckpointIO
    from phalanx.strategies import SingleDeviceStrategy

    class CustomCheckpointIO(TorchCheckpointIO):
        pass

    io = CustomCheckpointIO()
    cleanup.append("single_custom_io")
    StrategyRegistry.register("single_custom_io", SingleDeviceStrategy, description="custom io", checkpoint_io=io)
    strategy = StrategyRegistry.get("single_custom_io")
    assert strategy.checkpoint_io is io


def test_duplicate_runtime_name_needs_override(cleanup: list[str]) -> None:
    cleanup.append("toy_dup")
    StrategyRegistry.register("toy_dup", Toy)
    with pytest.raises(MisconfigurationError, match="already registered.*override=True"):
        StrategyRegistry.register("toy_dup", Toy)
    StrategyRegistry.register("toy_dup", Toy, override=True, colour="blue")
    assert StrategyRegistry.get("toy_dup").colour == "blue"
    with pytest.raises(MisconfigurationError, match="'single_device' is already registered by plugin 'builtin'"):
        StrategyRegistry.register("single_device", Toy)


def test_decorator_form_and_description_from_docstring(registry: Registry) -> None:
    @registry.register("decorated", size=7)
    class Decorated(Toy):
        """Decorated toy."""

    assert registry.get("decorated").size == 7
    assert registry.entry("decorated").description == "Decorated toy."
    registry.register("plain", Toy)
    assert registry.entry("plain").description == "A toy component. Second line is not part of the description."


def test_lazy_string_target_is_imported_only_on_use(registry: Registry) -> None:
    registry.register("decoder", "json.decoder:JSONDecoder", "lazy")
    assert registry.entry("decoder").target == "json.decoder:JSONDecoder"
    assert registry.get_class("decoder").__name__ == "JSONDecoder"


@pytest.mark.parametrize(
    ("name", "target", "message"),
    [
        ("", Toy, "non-empty string"),
        ("x", Toy(), "must be a class or a 'module:Attr' string, got Toy"),
        ("x", "no_colon_here", "not of the form 'module:Attr'"),
    ],
)
def test_bad_registrations(registry: Registry, name: str, target: object, message: str) -> None:
    with pytest.raises(MisconfigurationError, match=message):
        registry.register(name, target)  # type: ignore[arg-type]


def test_unknown_names_suggest_closest_match_and_list_choices() -> None:
    with pytest.raises(UnknownNameError) as info:
        AcceleratorRegistry.get("cpuu")
    text = str(info.value)
    assert "Unknown accelerator 'cpuu'" in text and "Did you mean 'cpu'?" in text and "cuda" in text
    with pytest.raises(UnknownNameError, match="Did you mean 'bf16-mixed'"):
        PrecisionRegistry.entry("bf16-mixd")


def test_unknown_first_party_name_names_the_distribution() -> None:
    if "deepspeed_stage_3" in StrategyRegistry:
        pytest.skip("phalanx-strategy-deepspeed is installed here")
    with pytest.raises(UnknownNameError, match="provided by phalanx-strategy-deepspeed.*pip install"):
        StrategyRegistry.get("deepspeed_stage_3")


@pytest.mark.parametrize(
    ("name", "distribution"),
    [
        ("model_parallel", "phalanx-strategy-model-parallel"),
        ("ModelParallelStrategy", "phalanx-strategy-model-parallel"),
        ("deepspeed_stage_3", "phalanx-strategy-deepspeed"),
        ("xla_fsdp", "phalanx-strategy-xla"),
    ],
)
def test_first_party_names_map_to_their_distribution(name: str, distribution: str) -> None:
    from phalanx._hints import install_hint, providing_distribution

    assert providing_distribution(name) == distribution
    assert install_hint(distribution).startswith(f"pip install {distribution} ")


def test_missing_strategy_class_import_names_distribution() -> None:
    import phalanx.strategies as strategies

    if "fsdp" in StrategyRegistry:
        pytest.skip("phalanx-strategy-fsdp is installed here")
    with pytest.raises(PluginUnavailableError, match="phalanx-strategy-fsdp"):
        strategies.FSDPStrategy  # noqa: B018
    with pytest.raises(ImportError, match="phalanx-strategy-fsdp"):
        from phalanx.strategies import FSDPStrategy  # noqa: F401
    with pytest.raises(AttributeError, match="installed strategies"):
        strategies.NoSuchThing  # noqa: B018


def test_registry_module_does_not_import_discovery() -> None:
    import ast
    from pathlib import Path

    import phalanx.registry

    tree = ast.parse(Path(phalanx.registry.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("phalanx.discovery") for name in imported), imported


def test_the_public_api_discovery_fills_a_registry_with() -> None:
    from phalanx.registry import PluginSource, registering_as

    calls: list[str] = []
    registry = Registry("widget")
    registry.fill_on_first_read(lambda: calls.append("filled"))
    vendor, other = PluginSource("vendor", "phalanx-vendor", "1.0"), PluginSource("other", "phalanx-other", "2.0")
    with registering_as(vendor):
        registry.register("shared", Toy)
        registry.register("mine", Toy)
    with registering_as(other):
        registry.register("shared", Toy)  # a second owner is recorded as a conflict, not raised
    assert calls == []  # writing during discovery does not trigger the fill
    assert registry.names() == ["shared", "mine"] and calls == ["filled"]
    assert registry.names_from("vendor") == ["shared", "mine"] and registry.names_from("other") == ["shared"]
    assert registry.remove_plugin("vendor") == ["shared", "mine"]
    assert registry.names() == [] and calls == ["filled"]  # filled once only
    registry.note_unloaded_plugin(PluginSource("widgets", "phalanx-widgets", "3.0"), "blocked; fix: unblock it")
    with pytest.raises(UnknownNameError, match=r"'widgets_big' would come from plugin 'widgets' \(phalanx-widgets 3.0\), which is not loaded: blocked; fix: unblock it"):
        registry.entry("widgets_big")
    with pytest.raises(UnknownNameError, match="Plugins that did not load, one of which may provide it: 'widgets': blocked"):
        registry.entry("gadget")
    registry.clear()
    assert registry.names() == [] and calls == ["filled", "filled"]
