"""torchrun (TorchElastic): the processes exist already and torchrun published their ranks.

Under ``torchrun`` phalanx launches nothing; it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``GROUP_RANK`` (the node rank), ``MASTER_ADDR`` and ``MASTER_PORT`` that torchrun sets for each
worker it starts.
"""

from __future__ import annotations

from phalanx.environments.launched import LaunchedEnvironment

__all__ = ["TorchElasticEnvironment"]


class TorchElasticEnvironment(LaunchedEnvironment):
    """Ranks and rendezvous as torchrun assigned them; phalanx's setters are ignored."""

    launcher_name = "torchrun"
    #: Set by torchrun for every worker; together they cannot come from anything else.
    required_variables = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    node_rank_variable = "GROUP_RANK"
    local_world_size_variable = "LOCAL_WORLD_SIZE"
    launcher_options = "torchrun's --nproc-per-node / --nnodes"
