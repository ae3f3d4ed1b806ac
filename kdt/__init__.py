"""kdt: the kernel development toolkit for DDTree speculative decoding."""

__version__ = "0.1.0"
