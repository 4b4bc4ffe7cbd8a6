"""phalanx-local-sgd: the ``local_sgd`` strategy (``phalanx_local_sgd.strategy.LocalSGDStrategy``)."""
