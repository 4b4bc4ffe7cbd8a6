"""LightningCLI: a training script's whole command line and config files, from the classes' signatures.

``LightningCLI(MyModel, MyData)`` builds a parser from the ``__init__`` signatures of the
Trainer, the Module and the DataModule (types, defaults and docstrings included), parses the
command line and any ``--config`` files, seeds, instantiates everything and runs the chosen
subcommand (``fit``, ``validate``, ``test``, ``predict``). It is Lightning's class under the
rename rule: the same constructor arguments, the same overridable methods (``add_arguments_to_parser``,
``before_fit``, ``instantiate_trainer``, ...), the same config layout, so a Lightning ``main.py``
and its YAML files run unchanged once ``lightning.pytorch`` reads ``phalanx``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Union

from torch.optim import Optimizer

from phalanx._cli.lightning_cli_optimizers import replace_configure_optimizers, with_class_path
from phalanx._cli.lightning_cli_parser import (
    ActionConfigFile,
    ArgsType,
    LightningArgumentParser,
    LRSchedulerTypeTuple,
    LRSchedulerTypeUnion,
    Namespace,
    ReduceLROnPlateau,
    class_from_function,
)
from phalanx._cli.lightning_cli_save import SaveConfigCallback
from phalanx.callbacks.callback import Callback
from phalanx.datamodule import DataModule
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer
from phalanx.utilities.rank_zero import rank_zero_warn
from phalanx.utilities.seed import seed_everything
from phalanx.version import __version__

__all__ = ["LightningCLI"]

_SUBCOMMANDS: dict[str, set[str]] = {
    "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
    "validate": {"model", "dataloaders", "datamodule"},
    "test": {"model", "dataloaders", "datamodule"},
    "predict": {"model", "dataloaders", "datamodule"},
}


class LightningCLI:
    """A configurable command line for training with phalanx: Lightning's LightningCLI.

    Args:
        model_class: The Module class (or a function returning one) to train; ``None`` accepts
            any Module given as ``--model path.to.Class``.
        datamodule_class: The DataModule class (or function); ``None`` makes ``--data`` optional
            and accepts any DataModule by class path.
        save_config_callback: The callback class that saves the resolved config (None: no saving).
        save_config_kwargs: Keyword arguments for ``save_config_callback`` (``{"overwrite": True}``).
        trainer_class: The Trainer class, or a function returning a Trainer.
        trainer_defaults: Trainer argument defaults; its ``callbacks`` are always added and cannot be
            configured away.
        seed_everything_default: The default of ``--seed_everything``: a seed, True (a random one)
            or False (no seeding).
        parser_kwargs: Keyword arguments for every parser, or per subcommand (``{"fit": {...}}``).
        parser_class: The parser class to use.
        subclass_mode_model: Accept any subclass of ``model_class`` given by class path.
        subclass_mode_data: Accept any subclass of ``datamodule_class`` given by class path.
        args: What to parse instead of ``sys.argv[1:]``: a list of command-line strings, or a
            dict / Namespace shaped like the config.
        run: Add the subcommands and run one; ``False`` only parses and instantiates.
        auto_configure_optimizers: Add ``--optimizer`` / ``--lr_scheduler`` and, when given, use them
            instead of the Module's ``configure_optimizers``.
        load_from_checkpoint_support: Accepted for compatibility; phalanx's ``save_hyperparameters``
            records the arguments ``__init__`` receives (Lightning's ``False`` behaviour).
    """

    def __init__(
        self,
        model_class: type[Module] | Callable[..., Module] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | dict[str, dict[str, Any]] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.load_from_checkpoint_support = load_from_checkpoint_support

        self.model_class = model_class
        self._model_class = model_class or Module  # the given value stays readable as model_class
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data

        main_kwargs, subparser_kwargs = self._setup_parser_kwargs(self.parser_kwargs)
        self.setup_parser(run, main_kwargs, subparser_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ------------------------------------------------------------------ parser

    def _setup_parser_kwargs(self, parser_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = self.subcommands().keys()
        main_kwargs = {k: v for k, v in parser_kwargs.items() if k not in names}
        subparser_kwargs = {k: v for k, v in parser_kwargs.items() if k in names}
        return main_kwargs, subparser_kwargs

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Create a parser with ``-c/--config``; the saved config's header names the phalanx version."""
        kwargs.setdefault("dump_header", [f"phalanx=={__version__}"])
        kwargs.setdefault("allow_abbrev", False)  # a typo'd option is an error, never a silent prefix match
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format."
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """Create the parser, with one sub-parser per subcommand when ``add_subcommands``."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``--seed_everything``."""
        parser.add_argument(
            "--seed_everything",
            type=Union[bool, int],  # noqa: UP007  (typing.Union: every jsonargparse version reads it)
            default=self.seed_everything_default,
            help="Set to an int to run seed_everything with this value before classes instantiation. Set to True to use a random seed.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the Trainer's, the Module's and the DataModule's arguments."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        # --data is optional without a datamodule_class: the Module may bring its own dataloaders.
        required = self.datamodule_class is not None
        parser.add_lightning_class_args(
            self._datamodule_class, "data", subclass_mode=self.subclass_mode_data, required=required
        )

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser.optimizer_groups:  # not added by add_arguments_to_parser
                parser.add_optimizer_args((Optimizer,))
            if not parser.lr_scheduler_groups:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or links to ``parser``."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the Trainer-method arguments the CLI fills in itself."""
        return {name: set(skip) for name, skip in _SUBCOMMANDS.items()}

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        parser_subcommands = parser.add_subcommands()
        trainer_class = (
            self.trainer_class if isinstance(self.trainer_class, type) else class_from_function(self.trainer_class)
        )
        for subcommand in self.subcommands():
            description = _short_description(getattr(trainer_class, subcommand))
            subparser_kwargs = dict(kwargs.get(subcommand, {}))
            subparser_kwargs.setdefault("description", description)
            subcommand_parser = self._prepare_subcommand_parser(trainer_class, subcommand, **subparser_kwargs)
            self._subcommand_parsers[subcommand] = subcommand_parser
            parser_subcommands.add_subcommand(subcommand, subcommand_parser, help=description)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        skip: set[str | int] = set(self.subcommands()[subcommand])
        self._subcommand_method_arguments[subcommand] = list(parser.add_method_arguments(klass, subcommand, skip=skip))
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link every optimizer / scheduler group registered with a ``link_to`` to its target."""
        for key, (class_type, link_to) in {**parser.optimizer_groups, **parser.lr_scheduler_groups}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(class_type, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(with_class_path, class_type))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (or ``sys.argv[1:]``) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            rank_zero_warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the command "
                "line. To prevent mistakes it is not recommended to provide both args and command line arguments, got: "
                f"sys.argv[1:]={sys.argv[1:]}, args={args}."
            )
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def adapt_checkpoint_hparams(self, subcommand: str, checkpoint_hparams: dict[str, Any]) -> dict[str, Any]:
        """Override to change the hyperparameters read from ``--ckpt_path`` before the Module is built."""
        return checkpoint_hparams

    def _parse_ckpt_path(self) -> None:
        """Take the Module's hyperparameters from ``--ckpt_path``'s checkpoint, as Lightning does."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not (isinstance(ckpt_path, (str, Path)) and Path(ckpt_path).is_file()):
            return
        import torch

        checkpoint = torch.load(ckpt_path, weights_only=True, map_location="cpu")
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        hparams = self.adapt_checkpoint_hparams(subcommand, hparams) if hparams else hparams
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        elif self.subclass_mode_model:
            # phalanx records no `_class_path`: the class is the one the config already names.
            class_path = (self.config[subcommand].get("model") or {}).get("class_path")
            hparams = {"class_path": class_path, "init_args": hparams} if class_path else {"init_args": hparams}
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    # ------------------------------------------------------------ instantiation

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are instantiated."""

    def instantiate_classes(self) -> None:
        """Instantiate the DataModule, the Module and the Trainer from the parsed config."""
        instantiate = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes
        self.config_init = instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are instantiated."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer from the config, plus ``kwargs``, the configured callbacks and the config saver."""
        extra_callbacks = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(trainer_config, extra_callbacks)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        key = "callbacks"
        if key not in config:
            rank_zero_warn(
                f"The `{self.trainer_class.__qualname__}` class does not expose the `{key}` argument so they will not be included."
            )
            return self.trainer_class(**config)
        value = config[key]
        config[key] = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
        config[key].extend(callbacks)
        if key in self.trainer_defaults:
            default = self.trainer_defaults[key]
            config[key] += default if isinstance(default, list) else [default]
        if self.save_config_callback and not config.get("fast_dev_run", False):
            subcommand_config = self.config.get(str(self.subcommand), self.config)
            config[key].append(
                self.save_config_callback(self._parser(self.subcommand), subcommand_config, **self.save_config_kwargs)
            )
        return self.trainer_class(**config)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(
        lightning_module: Module, optimizer: Optimizer, lr_scheduler: LRSchedulerTypeUnion | None = None
    ) -> Any:
        """Override to change what the configured optimizer and scheduler become in ``configure_optimizers``."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
            }
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """Replace the Module's ``configure_optimizers`` when ``--optimizer`` was given (AUTOMATIC groups)."""
        if self.auto_configure_optimizers:
            replace_configure_optimizers(self, self._parser(subcommand))

    def _get(self, config: Any, key: str, default: Any = None) -> Any:
        """A config value, looked up inside the subcommand's section when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    # ------------------------------------------------------------------ running

    def _run_subcommand(self, subcommand: str) -> None:
        before_fn = getattr(self, f"before_{subcommand}", None)
        if callable(before_fn):
            before_fn()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        fn(**self._prepare_subcommand_kwargs(subcommand))
        after_fn = getattr(self, f"after_{subcommand}", None)
        if callable(after_fn):
            after_fn()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        added = self._subcommand_method_arguments[subcommand]
        fn_kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in added}
        fn_kwargs["model"] = self.model
        if self.datamodule is not None:
            fn_kwargs["datamodule"] = self.datamodule
        return fn_kwargs

    def _set_seed(self) -> None:
        config_seed = self._get(self.config, "seed_everything")
        if config_seed is False:
            return
        # True: a random seed, recorded in the config (and the environment, for the other ranks).
        seed = seed_everything(workers=True) if config_seed is True else seed_everything(config_seed, workers=True)
        section = self.config[self.subcommand] if self.subcommand else self.config
        section["seed_everything"] = seed


def _short_description(component: object) -> str | None:
    """The first line of ``component``'s docstring: the subcommand's one-line help."""
    if component.__doc__ is None:
        return None
    import docstring_parser

    try:
        return docstring_parser.parse(component.__doc__).short_description
    except (ValueError, docstring_parser.ParseError) as error:
        rank_zero_warn(f"Failed parsing docstring for {component}: {error}")
        return None
