"""The speculative core, pure Python (no NumPy at import): Pyodide loads this whole folder."""
