"""The NumPy reference (CPython only): Llama forward pass, logits processors, model loading, convert, toy models."""
