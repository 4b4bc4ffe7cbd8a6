"""The environment the ``deepspeed`` command-line launcher gives each rank it starts.

``deepspeed train.py`` (and ``deepspeed --hostfile ...`` across machines) starts the ranks itself
and publishes ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``CROSS_RANK`` (the node index) and ``LOCAL_SIZE``. It does not set torchrun's variables, so
without this environment phalanx would take the node rank to be 0 on every machine. No torch
import: environment detection runs while plugins are listed.
"""

from __future__ import annotations

import os

from phalanx.environments.launched import LaunchedEnvironment

__all__ = ["DeepSpeedLauncherEnvironment"]


class DeepSpeedLauncherEnvironment(LaunchedEnvironment):
    """Ranks and rendezvous as the ``deepspeed`` launcher assigned them; phalanx's setters are ignored."""

    launcher_name = "the deepspeed launcher"
    #: Set together only by DeepSpeed's launcher (deepspeed/launcher/launch.py).
    required_variables = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CROSS_RANK", "LOCAL_SIZE")
    node_rank_variable = "CROSS_RANK"
    local_world_size_variable = "LOCAL_SIZE"
    launcher_options = "the launcher's --num_gpus / --num_nodes"

    @classmethod
    def detect(cls) -> bool:
        """All of the launcher's variables are set, and torchrun's are not (it wins when both are)."""
        return super().detect() and "TORCHELASTIC_RUN_ID" not in os.environ
