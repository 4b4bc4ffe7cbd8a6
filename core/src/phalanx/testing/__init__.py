"""Tools for plugin authors to prove their strategies behave: the conformance kit."""
