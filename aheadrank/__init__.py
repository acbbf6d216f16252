"""aheadrank: embed ahead, rank later."""

__version__ = "0.1.0"
