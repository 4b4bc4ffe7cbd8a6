"""Per-rank memory estimates: the data a strategy plugin receives and returns, and shared arithmetic.

``phalanx plan`` and ``Trainer.plan`` build the model on the meta device (shapes and dtypes, no
storage), describe it as a :class:`ModelSummary`, and ask every plugin through the
``phalanx_estimate_memory`` hook what one rank would hold under a strategy. A plugin answers for
the strategies whose target is its own class with a :class:`MemoryEstimate`, or ``None``; a
strategy nobody answers for is shown as "no estimate", never guessed.

Everything here is plugin-author API: the byte counts per precision and optimizer live in one
place so that every plugin's arithmetic agrees. This module is the bottom of the planning layers:
it asks no plugin and reads no model, so the hook contract (:mod:`phalanx.hookspecs`) can name its
types and importing it stays fast and torch-free. Reading a model is :mod:`phalanx.model_shapes`
(torch); asking the plugins and reporting is :mod:`phalanx.planning`, above the plugin machinery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx._byte_sizes import format_bytes, parse_bytes
from phalanx._optimizer_bytes import (
    FOREACH_DEVICE_TYPES,
    OPTIMIZER_STATE_BYTES,
    OPTIMIZER_STEP_TEMPORARIES,
    optimizer_state_bytes,
    optimizer_step_bytes,
)
from phalanx.errors import MisconfigurationError, closest_match

__all__ = [
    "FOREACH_DEVICE_TYPES",
    "OPTIMIZER_STATE_BYTES",
    "OPTIMIZER_STEP_TEMPORARIES",
    "PRECISION_BYTES",
    "MemoryEstimate",
    "MemoryRequest",
    "ModelSummary",
    "ParameterShape",
    "PrecisionBytes",
    "activation_estimate",
    "checkpointing_mode",
    "format_bytes",
    "gathered_bytes",
    "optimizer_state_bytes",
    "optimizer_step_bytes",
    "parse_bytes",
    "precision_bytes",
    "replicated_estimate",
    "shard",
]


@dataclass(frozen=True)
class PrecisionBytes:
    """Bytes per element of what a precision keeps: the weights, their gradients, activations.

    ``mixed`` is true when compute runs in a half type over float32 weights (autocast), which
    libraries that own the cast (DeepSpeed, FSDP2) turn into half weights plus a float32 master.
    ``float8`` is true when Linear weights are cast to float8 for their matmuls (torchao), which
    FSDP2 all-gathers as float8: one byte per element (:func:`gathered_bytes`).
    """

    weights: int
    gradients: int
    activations: int
    mixed: bool = False
    float8: bool = False


#: Canonical precision name -> bytes per element. Plugin precisions map onto these names.
PRECISION_BYTES: dict[str, PrecisionBytes] = {
    "32-true": PrecisionBytes(4, 4, 4),
    "64-true": PrecisionBytes(8, 8, 8),
    "16-mixed": PrecisionBytes(4, 4, 2, mixed=True),
    "bf16-mixed": PrecisionBytes(4, 4, 2, mixed=True),
    "16-true": PrecisionBytes(2, 2, 2),
    "bf16-true": PrecisionBytes(2, 2, 2),
    "xla-bf16-true": PrecisionBytes(2, 2, 2),
    "xla-bf16-mixed": PrecisionBytes(4, 4, 2, mixed=True),
    # torchao saves the float32 input and weight for backward; the float8 casts are temporaries
    "float8": PrecisionBytes(4, 4, 4, float8=True),
}

def precision_bytes(precision: str) -> PrecisionBytes:
    """Bytes per element for a canonical precision name (a key of :data:`PRECISION_BYTES`).

    Canonical names only, as :attr:`MemoryRequest.precision` always is: turning a user's spelling
    (``16``, ``"bf16"``) into one is for the Trainer and the CLI, so this module needs nothing from
    the precision package and stays below the plugin machinery.

    Raises:
        MisconfigurationError: Not a canonical name; names the valid ones and the closest.
    """
    if precision in PRECISION_BYTES:
        return PRECISION_BYTES[precision]
    hint = closest_match(str(precision), PRECISION_BYTES)
    msg = (
        f"precision {precision!r} has no known element sizes; valid names are {list(PRECISION_BYTES)}"
        f"{f' (closest: {hint!r})' if hint else ''}. Pass a canonical name, e.g. 'bf16-mixed' for 'bf16' and "
        "'16-mixed' for 16 (Trainer(precision=...) and `phalanx plan --precision` convert those spellings)."
    )
    raise MisconfigurationError(msg)


def shard(numel: int, ranks: int) -> int:
    """Elements one rank holds when ``numel`` is split over ``ranks`` (rounded up, as libraries pad)."""
    return math.ceil(numel / max(1, ranks))


@dataclass(frozen=True)
class ParameterShape:
    """One parameter as the meta device describes it: name, shape, dtype, trainable, and whether
    it is an ``nn.Linear``'s weight (what float8 training converts)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool = True
    linear_weight: bool = False

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSummary:
    """What a strategy needs to know about a model to size it, without its weights.

    Attributes:
        parameters: Every parameter (shared ones once), in ``named_parameters`` order.
        buffer_bytes: Bytes of registered buffers (replicated by every strategy).
        blocks: Parameter counts of the model's largest repeated units (the entries of its
            biggest ``ModuleList``/``Sequential``, or its direct children), which is what FSDP-style
            strategies gather one at a time.
        activation_bytes: Bytes autograd saves for backward in one forward pass over the sample
            input, traced on the meta device in float32; ``None`` when no input shape was given.
        input_shape: The sample input shape (per rank, one micro-batch).
        activation_note: Why activations are unknown when tracing the forward failed.
        block_activations: Per repeated block (the entries behind :attr:`blocks`), the bytes of its
            input and the bytes autograd saves inside it, traced with :attr:`activation_bytes`;
            what full activation checkpointing keeps instead (:func:`activation_estimate`).
        attention_bytes: Of :attr:`activation_bytes`, what ``F.scaled_dot_product_attention``
            calls save (traced as the fused kernels: query, key, value, output, log-sum-exp);
            under context parallel these cover the whole sequence, not a rank's share.
    """

    parameters: tuple[ParameterShape, ...]
    buffer_bytes: int = 0
    blocks: tuple[int, ...] = ()
    activation_bytes: int | None = None
    input_shape: tuple[int, ...] | None = None
    activation_note: str | None = None
    block_activations: tuple[tuple[int, int], ...] = ()
    attention_bytes: int = 0

    @property
    def numel(self) -> int:
        """All parameter elements."""
        return sum(p.numel for p in self.parameters)

    @property
    def trainable_numel(self) -> int:
        """Elements that get gradients and optimizer state."""
        return sum(p.numel for p in self.parameters if p.requires_grad)

    @property
    def float8_numel(self) -> int:
        """Elements of the Linear weights torchao's float8 converts (both dimensions multiples of 16)."""
        return sum(p.numel for p in self.parameters if p.linear_weight and all(d % 16 == 0 for d in p.shape))

    @property
    def largest_block(self) -> int:
        """Elements of the largest unit a sharded strategy gathers at once."""
        return max(self.blocks, default=self.numel)


@dataclass(frozen=True)
class MemoryRequest:
    """What ``phalanx_estimate_memory`` is asked: one strategy name, one model, one world.

    Attributes:
        strategy: The registered name (``"deepspeed_stage_3_offload"``).
        target: Its registered target as ``"module:Attr"``; a plugin answers when this is its class.
        init_params: The registered init params merged with the user's (``{"stage": 3, ...}``).
        model: The model's shapes.
        devices: Devices (processes) per node.
        num_nodes: Nodes.
        precision: Canonical precision name (``"bf16-mixed"``).
        optimizer: Optimizer kind, a key of :data:`OPTIMIZER_STATE_BYTES`.
        device_type: The ranks' device type (``"cuda"``, ``"cpu"``): it decides whether torch's
            optimizers step all tensors at once or one at a time (:func:`optimizer_step_bytes`).
    """

    strategy: str
    target: str
    init_params: Mapping[str, Any]
    model: ModelSummary
    devices: int = 1
    num_nodes: int = 1
    precision: str = "32-true"
    optimizer: str = "adamw"
    device_type: str = "cuda"

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.devices * self.num_nodes

    @property
    def bytes(self) -> PrecisionBytes:
        """Bytes per element of this request's precision."""
        return precision_bytes(self.precision)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank holds on its device during a training step, and what is kept elsewhere.

    Attributes:
        parameters: Model weights resident on the device (a shard when sharded), plus any half copy.
        gradients: Gradients held between backward and the step.
        optimizer_states: Optimizer state and float32 master weights a library keeps for the step.
        activations: Tensors saved for backward for the sample input; ``None`` when not asked.
        other: Buffers and communication buckets the library keeps for the whole run.
        transient: What exists only during forward and backward, like activations: gathered
            sharding units, unsharded gradients before their reduce-scatter, backward-only
            reduce buckets. Freed before the optimizer step.
        step: The optimizer step's temporaries (:func:`optimizer_step_bytes`), which exist
            while ``activations`` and ``transient`` are freed.
        cpu: Bytes this rank keeps in host memory when offloading.
        nvme: Bytes this rank keeps on NVMe.
        layout: How the state is spread, in words (``"sharded over 8"``, ``"dp=2 x tp=4"``).
        notes: What the numbers assume, e.g. which values are approximations.
    """

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int | None = None
    other: int = 0
    transient: int = 0
    step: int = 0
    cpu: int = 0
    nvme: int = 0
    layout: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def steady(self) -> int:
        """What the rank holds throughout a step: weights, gradients, optimizer state, ``other``."""
        return self.parameters + self.gradients + self.optimizer_states + self.other

    @property
    def total(self) -> int:
        """The per-rank peak: :attr:`steady` plus the larger of backward's working set
        (activations when known, plus :attr:`transient`) and the optimizer step's :attr:`step`."""
        return self.steady + max((self.activations or 0) + self.transient, self.step)

    @property
    def peak_other(self) -> int:
        """:attr:`total` less weights, gradients, optimizer state and activations: the buffers,
        gathered units or optimizer temporaries that make up the rest of the peak."""
        return self.total - self.parameters - self.gradients - self.optimizer_states - (self.activations or 0)

    def fits(self, device_bytes: int) -> bool:
        """Whether :attr:`total` fits in ``device_bytes``."""
        return self.total <= device_bytes

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``phalanx plan --json``)."""
        data = asdict(self)
        data["notes"] = list(self.notes)
        data["total"] = self.total
        return data


def gathered_bytes(request: MemoryRequest, numel: int) -> int:
    """Bytes of ``numel`` parameter elements all-gathered for compute (FSDP2's unsharded units).

    In the compute dtype (the half type under mixed precision); under ``float8`` the model's
    convertible Linear weights, spread evenly, are gathered as one byte each.
    """
    size = request.bytes
    compute = size.activations if size.mixed else size.weights
    if not size.float8:
        return numel * compute
    fraction = request.model.float8_numel / max(1, request.model.numel)
    return round(numel * (fraction + (1 - fraction) * compute))


def checkpointing_mode(request: MemoryRequest) -> str | None:
    """``"full"``, ``"selective"`` or None: the request's ``activation_checkpointing_policy``.

    Read from the strategy's init params as the user passed them: a set of block classes (full,
    Lightning's form), an object with a ``mode`` (``phalanx.utilities.ActivationCheckpointing``),
    or the mode's name (``phalanx plan --activation-checkpointing``).
    """
    policy = request.init_params.get("activation_checkpointing_policy")
    if policy is None or policy is False:
        return None
    if policy in ("full", "selective"):  # `phalanx plan --activation-checkpointing`
        return str(policy)
    return str(getattr(policy, "mode", "full"))


def activation_estimate(request: MemoryRequest, *, divisor: int = 1, context_parallel: int = 1) -> int | None:
    """The traced float32 activation bytes scaled to the request's compute precision, per rank.

    ``divisor`` splits them further (tensor parallel shards most activations over its ranks,
    context parallel the sequence). Under ``context_parallel`` > 1 the attention calls' saved
    tensors (:attr:`ModelSummary.attention_bytes`) are not split by it: each rank attends with the
    whole sequence's keys and values and, for causal load balancing, zero-padded queries, about
    ``(2 cp + 1) / 2 cp`` of the whole, and keeps its local share of them too (``1 / cp``: the
    first rank's unpadded chunk keeps the projections, and the output is copied back to the rank's
    tokens). Under full activation checkpointing of the repeated blocks
    (:func:`checkpointing_mode`), each block keeps only its input until backward, and one block's
    saved tensors exist again while it is recomputed: traced - saved in blocks + block inputs +
    the largest block's saved bytes, and once more for their gradients, which backward creates
    while the recomputed tensors are still alive (measured: a checkpointed BlockNet's backward
    peak is exactly one block's saved bytes above the rest of the estimate). Without
    checkpointing the saved tensors are freed as their gradients appear, and the gradients' net
    share (a block's saved bytes less its largest intermediate, about 4 % of the probe's BlockNet
    peaks) is not counted. Selective checkpointing keeps the matmul outputs, which the trace does
    not single out: it is estimated as no checkpointing (an upper bound).
    """
    traced = request.model.activation_bytes
    if traced is None:
        return None
    blocks = request.model.block_activations
    attention = request.model.attention_bytes
    if checkpointing_mode(request) == "full" and blocks:
        inside = sum(saved for _, saved in blocks)
        recomputed = max(saved for _, saved in blocks)
        traced = traced - inside + sum(given for given, _ in blocks) + 2 * recomputed  # saved + their gradients
        attention = attention // len(blocks)  # one block's attention is recomputed at a time
    cp = max(1, context_parallel)
    # divisor splits everything by cp; attention keeps (2cp + 1) / 2cp of its bytes on a rank, and
    # its local share once more (rank 0's unpadded first chunk keeps the projections; the output
    # is copied back to this rank's tokens): attention x ((2cp + 1) / 2cp + 1 / cp) per rank
    whole = attention * (2 * cp + 1) / 2 if cp > 1 else 0
    return math.ceil((traced + whole) * request.bytes.activations / 4 / max(1, divisor))


def replicated_estimate(request: MemoryRequest, *, layout: str, other: int = 0, notes: tuple[str, ...] = ()) -> MemoryEstimate:
    """A full copy of weights, gradients and optimizer state on every rank (single device, DDP).

    Plain torch optimizers keep their state in the parameters' dtype, so a ``-true`` half
    precision halves it too; ``other`` adds library buffers (DDP's gradient buckets).
    """
    model, size = request.model, request.bytes
    trainable = [p.numel for p in model.parameters if p.requires_grad]
    return MemoryEstimate(
        parameters=model.numel * size.weights,
        gradients=model.trainable_numel * size.gradients,
        optimizer_states=optimizer_state_bytes(request.optimizer, model.trainable_numel, state_dtype_bytes=size.weights),
        activations=activation_estimate(request),
        other=model.buffer_bytes + other,
        step=optimizer_step_bytes(
            request.optimizer, trainable, device_type=request.device_type, state_dtype_bytes=size.weights
        ),
        layout=layout,
        notes=notes,
    )
