"""A third-party phalanx plugin used by the integration tests."""
