"""growtool: offline width growth of transformer checkpoints."""

__version__ = "0.1.0"
