"""Plugin discovery: real distributions on sys.path, isolation of broken ones, blocking, conflicts."""

from __future__ import annotations

import pytest
from plugin_fixtures import SitePackages

from phalanx import _metadata, discovery
from phalanx.errors import PhalanxError, PluginUnavailableError, UnknownNameError
from phalanx.registry import PrecisionRegistry, StrategyRegistry

GOOD = """
from phalanx import hookimpl

class VendorStrategy:
    def __init__(self, flavour="plain"):
        self.flavour = flavour

@hookimpl
def phalanx_register_strategies(registry):
    registry.register("vendor", "{module}:VendorStrategy", "A vendor's strategy", flavour="spicy")
"""


def _good(site: SitePackages, name: str = "phalanx-fake-good") -> str:
    module = name.replace("-", "_")
    return site.add(name, module_source=GOOD.replace("{module}", module))


def _record(name: str) -> discovery.PluginRecord:
    return next(r for r in discovery.plugin_records() if r.name == name)


def test_builtin_plugin_is_discovered_through_its_entry_point() -> None:
    record = _record("builtin")
    assert record.distribution == "phalanx-core"
    assert record.status == "loaded"
    assert "single_device" in record.provides["strategy"]
    assert {"cpu", "cuda", "gpu", "mps"} <= set(record.provides["accelerator"])
    assert "phalanx_select_strategy" in record.hooks


def test_third_party_plugin_found_and_instantiated_with_init_params(site_packages: SitePackages) -> None:
    _good(site_packages)
    entry = StrategyRegistry.entry("vendor")
    assert entry.source.distribution == "phalanx-fake-good"
    assert entry.description == "A vendor's strategy"
    instance = StrategyRegistry.get("vendor")
    assert instance.flavour == "spicy"
    assert StrategyRegistry.get("vendor", flavour="mild").flavour == "mild"


def test_plugin_failing_at_import_is_isolated(site_packages: SitePackages) -> None:
    site_packages.add("phalanx-fake-broken", module_source="raise RuntimeError('boom at import')\n")
    _good(site_packages)
    record = _record("phalanx-fake-broken")
    assert record.status == "failed"
    assert "RuntimeError: boom at import" in (record.reason or "")
    assert "vendor" in StrategyRegistry  # the healthy plugin still works
    assert "single_device" in StrategyRegistry


def test_plugin_requiring_newer_core_is_reported_incompatible(site_packages: SitePackages) -> None:
    site_packages.add(
        "phalanx-fake-future",
        module_source=GOOD.replace("{module}", "phalanx_fake_future").replace('"vendor"', '"future"'),
        requires=("phalanx-core>=99",),
    )
    record = _record("phalanx-fake-future")
    assert record.status == "incompatible"
    assert "phalanx-core>=99" in (record.reason or "")
    assert "fix" in (record.reason or "")
    assert "future" not in StrategyRegistry


def test_two_plugins_registering_one_name_name_both_distributions(site_packages: SitePackages) -> None:
    _good(site_packages, "phalanx-fake-aaa")
    _good(site_packages, "phalanx-fake-bbb")
    entry = StrategyRegistry.entry("vendor")
    reason = entry.unavailable_reason() or ""
    assert "phalanx-fake-aaa" in reason and "phalanx-fake-bbb" in reason
    assert "PHALANX_DISABLE_PLUGINS=phalanx-fake-bbb" in reason
    with pytest.raises(PluginUnavailableError, match="registered by both"):
        StrategyRegistry.get("vendor")
    assert StrategyRegistry.get_class("single_device").__name__ == "SingleDeviceStrategy"


def test_disable_env_blocks_a_plugin_and_resolves_a_conflict(
    site_packages: SitePackages, monkeypatch: pytest.MonkeyPatch
) -> None:
    _good(site_packages, "phalanx-fake-aaa")
    _good(site_packages, "phalanx-fake-bbb")
    monkeypatch.setenv("PHALANX_DISABLE_PLUGINS", "phalanx-fake-bbb, other")
    discovery._reset_for_tests()
    assert _record("phalanx-fake-bbb").status == "blocked"
    assert StrategyRegistry.entry("vendor").source.distribution == "phalanx-fake-aaa"
    assert StrategyRegistry.get("vendor").flavour == "spicy"


def test_registration_hook_raising_rolls_back_that_plugin_only(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl
def phalanx_register_precisions(registry):
    registry.register("half-done", "x:Y")
    raise ValueError("second registration went wrong")
"""
    site_packages.add("phalanx-fake-halfway", module_source=source)
    record = _record("phalanx-fake-halfway")
    assert record.status == "failed"
    assert "phalanx_register_precisions raised ValueError" in (record.reason or "")
    assert "half-done" not in PrecisionRegistry
    assert "bf16-mixed" in PrecisionRegistry


def test_decision_hook_raising_names_the_plugin(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl
def phalanx_select_strategy(accelerator, num_devices, num_nodes, interactive):
    raise KeyError("no idea")
"""
    site_packages.add("phalanx-fake-decider", module_source=source)
    with pytest.raises(PhalanxError, match="phalanx-fake-decider.*PHALANX_DISABLE_PLUGINS=phalanx-fake-decider"):
        discovery.select_strategy_name(accelerator="cpu", num_devices=1, num_nodes=1, interactive=False)
    assert "single_device" in StrategyRegistry  # the registry keeps working


def test_plugin_answer_wins_over_builtin_auto_choice(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(tryfirst=True)  # ahead of any other installed plugin, e.g. phalanx-strategy-ddp
def phalanx_select_strategy(accelerator, num_devices, num_nodes, interactive):
    return "vendor_auto" if accelerator == "cpu" and num_devices == 4 else None
"""
    site_packages.add("phalanx-fake-auto", module_source=source)
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=4, num_nodes=1, interactive=False) == "vendor_auto"
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=1, num_nodes=1, interactive=False) == "single_device"
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=2, num_nodes=1, interactive=True) == "ddp_notebook"
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=1, num_nodes=2, interactive=False) == "ddp"


def test_unsatisfied_requirement_makes_entry_unavailable(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl
def phalanx_register_strategies(registry):
    registry.register("needs_missing", "json:JSONDecoder", requires=("phalanx-no-such-dist>=1",))
    registry.register("needs_old_core", "json:JSONDecoder", requires="phalanx-core<0.0.1")
"""
    site_packages.add("phalanx-fake-reqs", module_source=source)
    missing = StrategyRegistry.entry("needs_missing").unavailable_reason() or ""
    assert "not installed" in missing and "pip install 'phalanx-no-such-dist>=1'" in missing
    old = StrategyRegistry.entry("needs_old_core").unavailable_reason() or ""
    assert "phalanx-core 0.1.0 is installed" in old
    with pytest.raises(PluginUnavailableError, match="pip install 'phalanx-no-such-dist>=1'"):
        StrategyRegistry.get("needs_missing")


def test_invalid_plugin_with_unknown_hook_is_reported(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl
def phalanx_register_stratgies(registry):
    pass
"""
    site_packages.add("phalanx-fake-typo", module_source=source)
    _good(site_packages)
    record = _record("phalanx-fake-typo")
    assert record.status == "failed"
    reason = record.reason or ""
    assert "'phalanx_register_stratgies' (did you mean 'phalanx_register_strategies'?)" in reason
    assert "fix: rename it" in reason and "optionalhook=True" in reason
    assert "vendor" in StrategyRegistry  # every other plugin keeps working


def test_unknown_hook_marked_optional_is_ignored(site_packages: SitePackages) -> None:
    source = GOOD.replace("{module}", "phalanx_fake_newer") + """
@hookimpl(optionalhook=True)
def phalanx_hook_of_a_newer_core(registry):
    pass
"""
    site_packages.add("phalanx-fake-newer", module_source=source)
    assert _record("phalanx-fake-newer").status == "loaded"
    assert "vendor" in StrategyRegistry


def test_hookimpl_taking_an_argument_the_hook_does_not_pass(site_packages: SitePackages) -> None:
    source = GOOD.replace("{module}", "phalanx_fake_badsig").replace('"vendor"', '"badsig"') + """
@hookimpl
def phalanx_select_strategy(accelerator, devices):
    return "badsig"
"""
    site_packages.add("phalanx-fake-badsig", module_source=source)
    _good(site_packages)
    record = _record("phalanx-fake-badsig")
    assert record.status == "failed"
    reason = record.reason or ""
    assert "\n" not in reason
    assert "hook phalanx_select_strategy takes argument(s) 'devices', which it is never passed" in reason
    assert "accelerator, num_devices, num_nodes, interactive" in reason
    assert "fix: rename 'devices' to 'num_devices'" in reason
    assert "badsig" not in StrategyRegistry  # refused as a whole: none of its hooks run
    assert "vendor" in StrategyRegistry
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=1, num_nodes=1, interactive=False) == "single_device"


def test_wrapper_on_a_registration_hook_is_refused(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(wrapper=True)
def phalanx_register_strategies(registry):
    registry.register("wrapped", "json:JSONDecoder")
    yield
"""
    site_packages.add("phalanx-fake-regwrap", module_source=source)
    record = _record("phalanx-fake-regwrap")
    assert record.status == "failed"
    assert "phalanx_register_strategies of plugin 'phalanx-fake-regwrap' is declared wrapper=True" in (record.reason or "")
    assert "fix: drop wrapper=True" in (record.reason or "")
    assert "wrapped" not in StrategyRegistry


def test_registration_hooks_are_called_through_pluggy(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(specname="phalanx_register_strategies")
def add_my_strategies(registry):
    registry.register("by_specname", "json:JSONDecoder", "found through the hook spec, not the attribute")
"""
    site_packages.add("phalanx-fake-specname", module_source=source)
    assert StrategyRegistry.entry("by_specname").source.plugin == "phalanx-fake-specname"
    assert _record("phalanx-fake-specname").provides == {"strategy": ["by_specname"]}


def test_selecting_a_name_of_a_blocked_plugin_says_how_to_unblock(
    site_packages: SitePackages, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    source = GOOD.replace("{module}", "phalanx_fake_blk").replace('"vendor"', '"blk_fast"')
    site_packages.add("phalanx-fake-blk", module_source=source, entry_point="blk")
    monkeypatch.setenv("PHALANX_DISABLE_PLUGINS", "blk")
    discovery._reset_for_tests()
    with pytest.raises(UnknownNameError) as info:
        StrategyRegistry.get("blk_fast")
    text = str(info.value)
    assert "'blk_fast' would come from plugin 'blk' (phalanx-fake-blk 1.0), which is not loaded" in text
    assert "blocked by PHALANX_DISABLE_PLUGINS=blk; fix: unset PHALANX_DISABLE_PLUGINS to load it" in text
    assert "phalanx_fake_blk" not in sys.modules  # blocked through pluggy before any import
    assert discovery.get_plugin_manager().is_blocked("blk")


def test_blocking_ddp_explains_why_ddp_is_unknown(site_packages: SitePackages, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_DISABLE_PLUGINS", "ddp,other")
    discovery._reset_for_tests()
    with pytest.raises(UnknownNameError) as info:
        StrategyRegistry.entry("ddp")
    text = str(info.value)
    if _metadata.version("phalanx-strategy-ddp") is None:  # a core-only environment
        assert "provided by phalanx-strategy-ddp, which is not installed" in text
    else:
        assert "would come from plugin 'ddp' (phalanx-strategy-ddp" in text
        assert "blocked by PHALANX_DISABLE_PLUGINS=ddp,other; fix: PHALANX_DISABLE_PLUGINS=other to load it" in text


def test_target_that_fails_to_import_raises_when_selected(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl
def phalanx_register_strategies(registry):
    registry.register("ghost", "phalanx_fake_nowhere.strategy:Ghost", "does not exist")
"""
    site_packages.add("phalanx-fake-ghost", module_source=source)
    assert "ghost" in StrategyRegistry.names()
    with pytest.raises(PluginUnavailableError, match="ModuleNotFoundError"):
        StrategyRegistry.get("ghost")
