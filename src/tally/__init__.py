"""tally: a durable, replicated log store built on the design of Apache BookKeeper."""

__version__ = "0.1.0"
