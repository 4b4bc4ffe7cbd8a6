"""One conformance kit per plugin kind besides strategies (accelerator, precision, checkpoint IO,
cluster environment, callback, logger); import them from :mod:`phalanx.testing`."""

__all__: list[str] = []
