"""File formats and their validators, pure Python (no NumPy at import): Pyodide loads this whole folder."""
