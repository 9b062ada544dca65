"""corral: a local sandbox where AI agents run code."""

__version__ = "0.1.0"
