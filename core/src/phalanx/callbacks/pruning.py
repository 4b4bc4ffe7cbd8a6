"""ModelPruning: zero out the least useful weights during training, with ``torch.nn.utils.prune``.

Pruning shrinks what a model computes with, and the lottery-ticket procedure (prune, then rewind the
survivors to their initial values) finds sparse sub-networks that train as well as the dense one.
The callback runs PyTorch's own pruning at epoch ends, so masks and weights are exactly what a
hand-written ``torch.nn.utils.prune`` call gives. PyTorch prunes by re-parametrisation: ``weight``
becomes ``weight_orig * weight_mask``, recomputed before each forward; the optimizer keeps stepping
``weight_orig`` (the same Parameter object, so optimizer and strategy wrappers need no change).
``make_pruning_permanent`` folds the masks back into plain parameters when training ends and saves
checkpoints with plain ``weight`` keys, so they load into the unpruned class. Sharded strategies
(FSDP, DeepSpeed, model parallel) hold each weight split over the ranks, where per-tensor masks
would rank one shard only; the callback refuses them at setup (Lightning does not check).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.nn.utils.prune as pytorch_prune
from torch import Tensor, nn

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.rank_zero import rank_zero_debug, rank_zero_only

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["ModelPruning"]

log = logging.getLogger(__name__)

#: name -> (the function local pruning calls, the method class global pruning needs)
_PYTORCH_PRUNING: dict[str, tuple[Callable[..., Any], type[pytorch_prune.BasePruningMethod]]] = {
    "ln_structured": (pytorch_prune.ln_structured, pytorch_prune.LnStructured),
    "l1_unstructured": (pytorch_prune.l1_unstructured, pytorch_prune.L1Unstructured),
    "random_structured": (pytorch_prune.random_structured, pytorch_prune.RandomStructured),
    "random_unstructured": (pytorch_prune.random_unstructured, pytorch_prune.RandomUnstructured),
}

_PARAM_TUPLE = tuple[nn.Module, str]
_PARAM_LIST = Sequence[_PARAM_TUPLE]
# Containers hold no parameters of their own worth pruning (as Lightning: the Module itself is one).
_MODULE_CONTAINERS = (Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)


class _LayerRef(TypedDict):
    data: nn.Module
    names: list[tuple[int, str]]


def _pruned_names(module: nn.Module) -> list[str]:
    """Names of ``module``'s own tensors under a pruning re-parametrisation (``x_orig`` + ``x_mask``)."""
    buffers = [name for name, _ in module.named_buffers(recurse=False)]
    params = {name for name, _ in module.named_parameters(recurse=False)}
    return [b[: -len("_mask")] for b in buffers if b.endswith("_mask") and b[: -len("_mask")] + "_orig" in params]


class ModelPruning(Callback):
    """Prune parameters with ``torch.nn.utils.prune`` at the end of training (or validation) epochs.

    Example::

        pruning = ModelPruning("l1_unstructured", amount=0.5, parameters_to_prune=[(model.fc, "weight")])
        Trainer(callbacks=[pruning])

    With no ``parameters_to_prune``, every ``parameter_names`` tensor of every non-container
    submodule is pruned; override :meth:`filter_parameters_to_prune` to choose among them.

    Args:
        pruning_fn: A name in ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``; or a :class:`torch.nn.utils.prune.BasePruningMethod` subclass
            (the class, for global pruning); or, with ``use_global_unstructured=False``, a function
            called as ``fn(module, name=..., amount=...)`` like ``torch.nn.utils.prune.l1_unstructured``.
        parameters_to_prune: ``(module, "name")`` pairs; empty: every ``parameter_names`` tensor.
        parameter_names: ``"weight"`` and/or ``"bias"`` (default both), used when the above is empty.
        use_global_unstructured: Rank all selected tensors together (``global_unstructured``), so
            ``amount`` is a share of all of them rather than of each one. Needs an unstructured method.
        amount: A float in [0, 1] (share of the remaining entries), an int (count), or a callable
            ``epoch -> amount``; 0 skips the epoch.
        apply_pruning: Whether to prune: a bool, or a callable ``epoch -> bool``.
        make_pruning_permanent: Fold the masks into plain parameters when training ends, and save
            checkpoints with plain ``weight`` keys (training keeps its masks meanwhile).
        use_lottery_ticket_hypothesis: After pruning, reset the surviving weights to their values at
            setup (`arXiv:1803.03635 <https://arxiv.org/abs/1803.03635>`_): a bool or ``epoch -> bool``.
        resample_parameters: With the lottery ticket, rewind to fresh draws (a copy's ``reset_parameters``).
        pruning_dim: The dimension for (and required by) ``*_structured`` names.
        pruning_norm: The norm for (and required by) ``"ln_structured"``.
        verbose: 0 silent, 1 logs overall sparsity after each pruning, 2 also per tensor (rank 0).
        prune_on_train_epoch_end: Prune at the training epoch end (True) or at the end of each
            validation epoch outside the sanity check (False).

    Raises:
        MisconfigurationError: A bad argument; at setup, a sharded strategy or tensors not in the model.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: _PARAM_LIST = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune: _PARAM_LIST = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, _LayerRef] | None = None
        self._pruning_method_name: str | None = None

        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                msg = (
                    f"ModelPruning(parameter_names=...): {name} isn't in {self.PARAMETER_NAMES}, the valid names. "
                    "Fix: pass e.g. parameter_names=['weight'], or list other tensors in parameters_to_prune."
                )
                raise MisconfigurationError(msg)
        self.pruning_fn = self._resolve_pruning_fn(pruning_fn, pruning_dim, pruning_norm)
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if isinstance(amount, bool) or not (isinstance(amount, int | float) or callable(amount)):
            msg = (
                f"ModelPruning(amount={amount!r}) must be a float in [0, 1] (share), an int (count) or a callable "
                "epoch -> amount. Fix: pass e.g. amount=0.5."
            )
            raise MisconfigurationError(msg)
        self.amount = amount
        if verbose not in (0, 1, 2):
            msg = (
                f"ModelPruning(verbose={verbose!r}) must be any of (0, 1, 2): 0 silent, 1 overall sparsity, 2 per "
                "tensor."
            )
            raise MisconfigurationError(msg)
        self._verbose = verbose

    # ------------------------------------------------------------------ configuration
    def _resolve_pruning_fn(self, pruning_fn: Any, dim: int | None, norm: int | None) -> Callable[..., Any]:
        """Turn ``pruning_fn`` into what :meth:`apply_pruning` calls, checking it fits the other arguments."""
        names = list(_PYTORCH_PRUNING)
        if isinstance(pruning_fn, str):
            key = pruning_fn.lower()
            if key not in _PYTORCH_PRUNING:
                msg = (
                    f"ModelPruning(pruning_fn={pruning_fn!r}) is not one of PyTorch's built-in pruning functions; "
                    f"expected to be a str in {names}. Fix: pass one of them, or a torch.nn.utils.prune.BasePruningMethod "
                    "subclass."
                )
                raise MisconfigurationError(msg)
            kwargs: dict[str, Any] = {}
            if key.endswith("_structured"):
                if dim is None:
                    msg = (
                        f"ModelPruning(pruning_fn={key!r}) prunes whole slices, so pruning_dim should be provided "
                        "(e.g. 0: rows)."
                    )
                    raise MisconfigurationError(msg)
                if key == "ln_structured":
                    if norm is None:
                        msg = (
                            "When requesting `ln_structured` pruning, the `pruning_norm` should be provided (e.g. 1 "
                            "or 2): ModelPruning(pruning_fn='ln_structured', pruning_norm=...)."
                        )
                        raise MisconfigurationError(msg)
                    kwargs["n"] = norm
                kwargs["dim"] = dim
            resolved = self._create_pruning_fn(key, **kwargs)
        elif self._is_pruning_method(pruning_fn):
            if not self._use_global_unstructured:
                msg = (
                    f"ModelPruning(pruning_fn={pruning_fn.__name__}) with use_global_unstructured=False: a "
                    "BasePruningMethod class is currently only supported with `use_global_unstructured=True`. Fix: set it to "
                    f"True, or pass a pruning function or one of {names}."
                )
                raise MisconfigurationError(msg)
            resolved = pruning_fn
            self._pruning_method_name = pruning_fn.__name__
        elif callable(pruning_fn) and not inspect.isclass(pruning_fn) and not self._use_global_unstructured:
            resolved = pruning_fn
            self._pruning_method_name = getattr(pruning_fn, "__name__", repr(pruning_fn))
        else:
            msg = (
                f"ModelPruning(pruning_fn={pruning_fn!r}) is not supported: expected to be a str in {names} or a "
                "torch.nn.utils.prune.BasePruningMethod subclass (the class, not an instance); a plain pruning "
                "function needs use_global_unstructured=False."
            )
            raise MisconfigurationError(msg)
        pruning_type = getattr(resolved, "PRUNING_TYPE", None)
        if self._use_global_unstructured and pruning_type != "unstructured":
            msg = (
                f"Only the 'unstructured' PRUNING_TYPE is supported with `use_global_unstructured=True`; "
                f"{self._pruning_method_name} has PRUNING_TYPE={pruning_type!r}. Fix: pass "
                "use_global_unstructured=False, or an unstructured method such as 'l1_unstructured'."
            )
            raise MisconfigurationError(msg)
        return resolved

    def _create_pruning_fn(self, pruning_fn: str, **kwargs: Any) -> Callable[..., Any]:
        """The method class (global pruning, kwargs kept for the call) or the function with kwargs bound."""
        function, method = _PYTORCH_PRUNING[pruning_fn]
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
            self._pruning_method_name = method.__name__
            return method
        self._pruning_method_name = function.__name__  # a partial has no __name__: keep it for the logs
        return partial(function, **kwargs)

    @staticmethod
    def _is_pruning_method(method: Any) -> bool:
        return inspect.isclass(method) and issubclass(method, pytorch_prune.BasePruningMethod)

    def filter_parameters_to_prune(self, parameters_to_prune: _PARAM_LIST = ()) -> _PARAM_LIST:
        """Override to choose which ``(module, name)`` pairs are pruned; returns them all by default."""
        return parameters_to_prune

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module, parameters_to_prune: _PARAM_LIST = (), parameter_names: Sequence[str] = ()
    ) -> _PARAM_LIST:
        """Check ``parameters_to_prune`` against the model, or build it from ``parameter_names`` when empty.

        Raises:
            MisconfigurationError: An entry is not a ``(module, name)`` pair, or not in ``pl_module``.
        """
        parameters = parameter_names or ModelPruning.PARAMETER_NAMES
        current_modules = [m for m in pl_module.modules() if not isinstance(m, _MODULE_CONTAINERS)]
        if not parameters_to_prune:
            return [
                (m, p) for p in parameters for m in current_modules if isinstance(getattr(m, p, None), nn.Parameter)
            ]
        pairs_ok = isinstance(parameters_to_prune, list | tuple) and all(
            isinstance(p, list | tuple) and len(p) == 2 and isinstance(p[0], nn.Module) and isinstance(p[1], str)
            for p in parameters_to_prune
        )
        if not pairs_ok:
            msg = (
                f"ModelPruning(parameters_to_prune={parameters_to_prune!r}) must be a list of (nn.Module, "
                "parameter_name) pairs, e.g. [(model.fc, 'weight')], or empty to prune every parameter_names tensor."
            )
            raise MisconfigurationError(msg)
        known = {id(m) for m in current_modules}
        missing_modules = [m for m, _ in parameters_to_prune if id(m) not in known]
        missing_parameters = [n for m, n in parameters_to_prune if id(m) in known and not hasattr(m, n)]
        if missing_modules or missing_parameters:
            msg = (
                "Some ModelPruning parameters_to_prune are not in the model: missing modules "
                f"{missing_modules}, missing parameters {missing_parameters}. Fix: pass submodules of the Module "
                "being fit (not containers such as nn.Sequential) and names of their tensors."
            )
            raise MisconfigurationError(msg)
        return parameters_to_prune

    # ------------------------------------------------------------------ pruning
    def _apply_local_pruning(self, amount: int | float) -> None:
        for module, name in self._parameters_to_prune:
            self.pruning_fn(module, name=name, amount=amount)

    def _apply_global_pruning(self, amount: int | float) -> None:
        # pass the method class only the keywords its __init__ takes (amount, and dim / n where it has them)
        self._global_kwargs["amount"] = amount
        params = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
        kwargs = {k: v for k, v in self._global_kwargs.items() if k in params}
        pytorch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs)

    @staticmethod
    def _get_pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
        mask = getattr(module, f"{name}_mask", None)
        return (0, 1) if mask is None else (int((mask == 0).sum().item()), mask.numel())

    def apply_pruning(self, amount: int | float) -> None:
        """Prune ``parameters_to_prune`` by ``amount`` (of what remains), globally or tensor by tensor."""
        prev = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._apply_global_pruning(amount)
        else:
            self._apply_local_pruning(amount)
        if self._verbose:
            curr = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune]
            self._log_sparsity_stats(prev, curr, amount=amount)

    @rank_zero_only
    def _log_sparsity_stats(
        self, prev: list[tuple[int, int]], curr: list[tuple[int, int]], amount: int | float = 0
    ) -> None:
        total = sum(size for _, size in curr)
        before, after = sum(z for z, _ in prev), sum(z for z, _ in curr)
        log.info(
            f"Applied `{self._pruning_method_name}`. Pruned: {before}/{total} ({before / total:.2%}) -> "
            f"{after}/{total} ({after / total:.2%})"
        )
        if self._verbose == 2:
            for (module, name), (z0, n0), (z1, n1) in zip(self._parameters_to_prune, prev, curr, strict=True):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. "
                    f"Pruned: {z0} ({z0 / n0:.2%}) -> {z1} ({z1 / n1:.2%})"
                )

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Fold every pruning mask under ``module`` into a plain parameter and drop the masks and hooks."""
        for submodule in module.modules():
            for name in _pruned_names(submodule):
                pytorch_prune.remove(submodule, name)

    @staticmethod
    def _copy_for_lottery_ticket(module: nn.Module) -> nn.Module:
        """A plain (unpruned) deep copy of ``module``: the values the lottery ticket rewinds to.

        A pruned module holds ``weight`` as a non-leaf tensor, which ``deepcopy`` refuses, so those
        are swapped for detached values around the copy; the copy's masks are then folded in.
        """
        computed = {name: getattr(module, name) for name in _pruned_names(module)}
        try:
            for name, value in computed.items():
                setattr(module, name, value.detach())
            copy = deepcopy(module)
        finally:
            for name, value in computed.items():
                setattr(module, name, value)
        for name in _pruned_names(copy):
            pytorch_prune.remove(copy, name)
        return copy

    @staticmethod
    def _copy_param(new: nn.Module, old: nn.Module, name: str) -> None:
        """Write ``old.name`` into the tensor the optimizer steps (``name_orig`` once pruned), in place.

        In place (Lightning rebinds ``.data``), so the optimizer and strategy keep the same storage and
        the recorded copy is never aliased by the live weights that training then updates.
        """
        orig = getattr(new, name + "_orig", None)
        dst = orig if orig is not None else getattr(new, name)
        src = getattr(old, name)
        if not isinstance(dst, Tensor) or not isinstance(src, Tensor):
            return
        with torch.no_grad():
            dst.copy_(src.to(device=dst.device, dtype=dst.dtype))
        mask = getattr(new, name + "_mask", None)
        if isinstance(mask, Tensor) and orig is not None:
            # what the forward pre-hook would compute; until the next forward ``name`` would show stale values
            setattr(new, name, mask.to(dtype=dst.dtype) * dst)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Rewind the surviving weights to their values at setup (step 4 of the lottery-ticket algorithm).

        The masks keep the pruned entries at zero; ``resample_parameters`` draws new initial values
        from each layer's ``reset_parameters`` instead of reusing the recorded ones.
        """
        if self._original_layers is None:
            msg = "ModelPruning.apply_lottery_ticket_hypothesis() ran before setup recorded the original weights."
            raise MisconfigurationError(msg)
        for ref in self._original_layers.values():
            copy = ref["data"]
            if self._resample_parameters and callable(getattr(copy, "reset_parameters", None)):
                copy = deepcopy(copy)  # keep the recorded values for later epochs
                copy.reset_parameters()  # type: ignore[operator]
            for i, name in ref["names"]:
                module, _ = self._parameters_to_prune[i]
                self._copy_param(module, copy, name)

    def _run_pruning(self, current_epoch: int) -> None:
        prune = self._apply_pruning(current_epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(current_epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        # At a validation epoch end the Trainer may be in inference mode; masks made there would be
        # inference tensors that the next training forward cannot use in autograd.
        with torch.inference_mode(False):
            self.apply_pruning(amount)
            lottery = self._use_lottery_ticket_hypothesis
            if lottery(current_epoch) if callable(lottery) else lottery:
                self.apply_lottery_ticket_hypothesis()

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Refuse sharded strategies, resolve the tensors to prune and record their initial values."""
        if stage == "fit" and trainer.strategy.restore_checkpoint_after_setup:
            msg = (
                f"ModelPruning does not support sharded models (strategy {trainer.strategy_name!r}, "
                f"{type(trainer.strategy).__name__}): each rank holds only a shard of every weight, so masks "
                "computed per tensor would prune the wrong entries. Fix: use strategy='ddp' (or one device), "
                "or remove ModelPruning."
            )
            raise MisconfigurationError(msg)
        parameters_to_prune = self.sanitize_parameters_to_prune(
            pl_module, self._parameters_to_prune, parameter_names=self._parameter_names
        )
        self._parameters_to_prune = self.filter_parameters_to_prune(parameters_to_prune)
        if self._use_lottery_ticket_hypothesis:
            self._original_layers = None  # let a previous fit's copies go before making new ones
            layers: dict[int, _LayerRef] = {}
            for i, (module, name) in enumerate(self._parameters_to_prune):
                ref = layers.setdefault(id(module), _LayerRef(data=self._copy_for_lottery_ticket(module), names=[]))
                ref["names"].append((i, name))
            self._original_layers = layers

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Prune here unless ``prune_on_train_epoch_end=False``."""
        if self._prune_on_train_epoch_end:
            rank_zero_debug("`ModelPruning.on_train_epoch_end`. Applying pruning")
            self._run_pruning(trainer.current_epoch)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Prune here (not in the sanity check) when ``prune_on_train_epoch_end=False``."""
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            rank_zero_debug("`ModelPruning.on_validation_epoch_end`. Applying pruning")
            self._run_pruning(trainer.current_epoch)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Fold the masks into plain parameters when ``make_pruning_permanent``."""
        if self._make_pruning_permanent:
            rank_zero_debug("`ModelPruning.on_train_end`. Pruning is made permanent")
            self.make_pruning_permanent(pl_module)

    def _make_pruning_permanent_on_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` with each ``x_orig`` / ``x_mask`` pair replaced by ``x = orig * mask`` (CPU)."""
        result = dict(state_dict)
        for base in [k[: -len("_mask")] for k in state_dict if k.endswith("_mask")]:
            if base + "_orig" in result:
                orig, mask = result.pop(base + "_orig"), result.pop(base + "_mask")
                result[base] = mask.to(dtype=orig.dtype) * orig
        return {k: v.detach().cpu() if isinstance(v, Tensor) else v for k, v in result.items()}

    def on_save_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """With ``make_pruning_permanent``, save plain ``weight`` keys; training keeps its masks."""
        if self._make_pruning_permanent:
            rank_zero_debug("`ModelPruning.on_save_checkpoint`. Pruning is made permanent for this checkpoint")
            checkpoint["state_dict"] = self._make_pruning_permanent_on_state_dict(checkpoint["state_dict"])
