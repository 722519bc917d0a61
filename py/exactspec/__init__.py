"""exactspec: exact speculative decoding (reference core, orchestrator and CLI)."""
__version__ = "0.1.0"
