"""tally's version, in a module of its own: reading it imports nothing else of tally."""

__version__ = "0.1.0"
