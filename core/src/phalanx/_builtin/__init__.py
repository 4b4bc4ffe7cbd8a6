"""The core's own plugin, declared through the same ``phalanx`` entry-point group as any other."""
