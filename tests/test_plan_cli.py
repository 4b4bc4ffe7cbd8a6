"""``phalanx plan`` and ``Trainer.plan``: tables, JSON, the dry run, and one error per bad input.

Runs in the integration session (it plans every installed strategy: ddp, fsdp, deepspeed, ...), in-process through ``phalanx.cli.main`` (the command's own entry point) on the example
factories; every model is built on the meta device, so even the 1.3B configuration costs well
under a second of planning after the imports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

import phalanx
from phalanx.cli import main
from phalanx.errors import MisconfigurationError
from phalanx.memory import MemoryEstimate, parse_bytes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "plan_models.py"


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_table_fits_100_columns_and_every_strategy_has_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, f"{EXAMPLES}:build_1_3b", "--devices", "8", "--all", "--device-memory", "24GiB")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "1.32B parameters" in out
    for name in ("single_device", "ddp", "fsdp", "deepspeed_stage_3_offload", "model_parallel"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), (name, out)
    lines = out.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("STRATEGY"))) + 1 :]
    shown = [line[:28].strip() for line in rows if line[:1].isalpha() and line[27:28] == " " and ":" not in line[:28]]
    assert len(shown) > 10 and len(set(shown)) == len(shown), shown  # cut names stay distinguishable
    assert "ddp_find_unused_par..._true" in shown and "ddp_find_unused_pa..._false" in shown
    assert any(line.startswith("OTHER:") and "gathered" in line for line in lines), out  # the legend


def test_json_matches_the_estimates_and_single_device_is_the_plain_arithmetic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = plan(
        capsys,
        f"{EXAMPLES}:build_small",
        "--strategy",
        "single_device",
        "--strategy",
        "fsdp",
        "--devices",
        "4",
        "--json",
        "--input-shape",
        "2,128",
    )
    assert code == 0
    report = json.loads(out)
    numel = report["model"]["parameters"]
    rows = {row["strategy"]: row["estimate"] for row in report["strategies"]}
    assert rows["single_device"]["parameters"] == rows["single_device"]["gradients"] == 4 * numel
    assert rows["single_device"]["optimizer_states"] == 8 * numel
    assert rows["single_device"]["activations"] > 0
    assert abs(rows["fsdp"]["parameters"] - numel) <= 0.01 * numel  # a quarter of 4 bytes each
    fsdp = rows["fsdp"]
    steady = sum(fsdp[k] for k in ("parameters", "gradients", "optimizer_states", "other"))
    assert fsdp["total"] == steady + max(fsdp["activations"] + fsdp["transient"], fsdp["step"])


def test_folded_counts_are_derived_and_explained_while_json_lists_every_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, table, _ = plan(capsys, f"{EXAMPLES}:build_small", "--devices", "8")
    assert code == 0
    code, out, _ = plan(capsys, f"{EXAMPLES}:build_small", "--devices", "8", "--json")
    assert code == 0
    rows = json.loads(out)["strategies"]
    names = [row["strategy"] for row in rows]
    assert "ddp_find_unused_parameters_true" in names and not any("(+" in name for name in names)  # never folded
    same = [row["strategy"] for row in rows if row["estimate"] == rows[names.index("ddp")]["estimate"]]
    first = same[0]
    assert any(line.startswith(f"{first} (+{len(same) - 1}) ") for line in table.splitlines()), (same, table)
    assert "(+N): N more names with the same estimate" in table  # the output says what the count means
    help_text = " ".join(_help(capsys).split())
    assert "'ddp (+N)' stands for ddp and N more names with the same estimate" in help_text


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    return capsys.readouterr().out


def test_70b_plans_in_seconds_without_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(
        capsys, f"{EXAMPLES}:build_70b", "--devices", "8", "--strategy", "fsdp", "--device-memory", "80GiB"
    )
    assert code == 0 and "NO" in out and "nothing fits" in out and "auto_wrap_policy" in out


def test_strategy_without_an_answer_is_no_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, f"{EXAMPLES}:build_small", "--all")
    assert code == 0
    assert "; 1 rank (1 x 1);" in out  # singular
    assert "no estimate" in out or all("no estimate" not in line for line in out.splitlines())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuchmodule_xyz:build"], "cannot import 'nosuchmodule_xyz'"),
        ([f"{EXAMPLES}:build_tiny"], "no callable 'build_tiny'"),
        ([f"{EXAMPLES}"], "names no factory"),
        ([f"{EXAMPLES}:Config"], "not a torch.nn.Module"),
        ([f"{EXAMPLES}:build_small", "--strategy", "fsdq"], "unknown strategy 'fsdq'; closest match: 'fsdp'"),
        ([f"{EXAMPLES}:build_small", "--device-memory", "lots"], "device memory 'lots' is not a size"),
        ([f"{EXAMPLES}:build_small", "--optimizer", "adamx"], "optimizer 'adamx'"),
        ([f"{EXAMPLES}:build_small", "--input-shape", "a,b"], "--input-shape 'a,b'"),
    ],
)
def test_bad_input_is_one_error_with_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    code, out, err = plan(capsys, *args)
    err = " ".join(err.split())  # the message is wrapped to the terminal
    assert code == 2 and out == ""
    assert err.count("error:") == 1 and needle in err, err
    assert "Pass" in err or "Fix" in err or "Choose" in err


def test_model_that_cannot_be_built_on_meta_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = tmp_path / "bad.py"
    factory.write_text(
        "import torch\ndef build():\n    w = torch.ones(3)\n    return torch.nn.Linear(int(w.sum().item()), 2)\n"
    )
    code, _, err = plan(capsys, f"{factory}:build")
    err = " ".join(err.split())  # the message is wrapped to the terminal
    assert code == 2 and "cannot be built on the meta device" in err and "Fix:" in err and ".item()" in err


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30 and parse_bytes("24 GB") == 24 * 10**9 and parse_bytes(512) == 512
    with pytest.raises(MisconfigurationError, match="'80Gb/s'"):
        parse_bytes("80Gb/s")


class Small(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer: nn.Module | None = None

    def configure_model(self) -> None:
        if self.layer is None:
            self.layer = nn.Linear(1000, 1000)

    def training_step(self, batch: object, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> object:
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_trainer_dry_run_sizes_configure_model_layers_on_meta_and_reads_the_optimizer() -> None:
    trainer = phalanx.Trainer(accelerator="cpu", strategy="single_device", devices=1, logger=False)
    model = Small()
    report = trainer.plan(model, device_memory="1MiB")
    assert model.layer is None  # the user's model is untouched; a meta copy was sized
    assert report.optimizer == "sgd_momentum"
    row = report.row("single_device")
    assert isinstance(row.estimate, MemoryEstimate) and row.fits is False
    assert row.estimate.parameters == 4 * 1_001_000 and row.estimate.optimizer_states == 4 * 1_001_000
    assert "single_device" in str(report)


def test_trainer_dry_run_refuses_a_non_module() -> None:
    trainer = phalanx.Trainer(accelerator="cpu", strategy="single_device", devices=1, logger=False)
    with pytest.raises(MisconfigurationError, match="needs a torch.nn.Module"):
        trainer.plan(object())


def test_param_and_activation_checkpointing_reach_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    """``--param`` passes strategy arguments (model_parallel's mesh sizes) and
    ``--activation-checkpointing`` the policy: context parallel 2 halves the activations but
    attention's, full checkpointing lowers them, and the other parts follow the mesh."""

    def activations(*extra: str) -> dict[str, int]:
        code, out, err = plan(
            capsys, f"{EXAMPLES}:build_1_3b", "--devices", "8", "--strategy", "model_parallel",
            "--input-shape", "1,2048", "--json", "--param", "tensor_parallel_size=2", *extra,
        )  # fmt: skip
        assert code == 0, err
        return json.loads(out)["strategies"][0]["estimate"]

    plain = activations()
    halved = activations("--param", "context_parallel_size=2")
    checkpointed = activations("--activation-checkpointing", "full")
    # cp 2 halves all but attention's saved tensors, which cover the whole sequence (5/4 of it with
    # the causal load balancing's padded queries) plus this rank's half
    from phalanx._cli.plan import load_factory
    from phalanx.model_shapes import build_on_meta, summarize_model

    summary = summarize_model(build_on_meta(load_factory(f"{EXAMPLES}:build_1_3b")), input_shape=(1, 2048))
    assert summary.activation_bytes is not None and summary.attention_bytes > 0
    attention = summary.attention_bytes / 2  # tp 2 splits the heads
    expected = (plain["activations"] - attention) / 2 + attention * (5 / 4 + 1 / 2)
    assert abs(halved["activations"] - expected) <= 2, (plain, halved, expected)
    assert plain["activations"] / 2 < halved["activations"] < plain["activations"]
    assert "cp=2" in halved["layout"]
    assert checkpointed["activations"] < plain["activations"] / 4, (plain, checkpointed)
    assert checkpointed["parameters"] == plain["parameters"]


def test_a_param_without_a_value_is_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = plan(capsys, f"{EXAMPLES}:build_1_3b", "--param", "context_parallel_size")
    assert code == 2 and not out
    assert "--param 'context_parallel_size' is not KEY=VALUE" in err and "Fix: e.g. --param" in err


def test_float8_gathers_linear_weights_at_one_byte(capsys: pytest.CaptureFixture[str]) -> None:
    """``--precision float8``: weights, gradients, optimizer state and activations stay float32
    (torchao keeps float32 masters and saves float32 inputs); what FSDP2 gathers at once has its
    Linear weights in float8, one byte each instead of four (no torchao needed to plan)."""
    from phalanx._cli.plan import load_factory
    from phalanx.model_shapes import build_on_meta, summarize_model

    def estimate(precision: str) -> dict[str, int]:
        code, out, err = plan(
            capsys, f"{EXAMPLES}:build_1_3b", "--devices", "8", "--strategy", "fsdp", "--json", "--precision", precision
        )
        assert code == 0, err
        return json.loads(out)["strategies"][0]["estimate"]

    float32, float8 = estimate("32-true"), estimate("float8")
    summary = summarize_model(build_on_meta(load_factory(f"{EXAMPLES}:build_1_3b")))
    # the blocks' Linear weights (0.69 of the model); the embedding, norms and the 50257-wide head
    # (not a multiple of 16: torchao cannot convert it) stay float32
    assert 0.6 < summary.float8_numel / summary.numel < 0.8
    for key in ("parameters", "gradients", "optimizer_states"):
        assert float8[key] == float32[key]
    saved = float32["transient"] - float8["transient"]
    assert saved == 3 * summary.float8_numel  # the whole model is one unit: every Linear weight, 4 -> 1 byte
