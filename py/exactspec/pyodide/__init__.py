"""The Pyodide adapter (browser_backend.py), pure Python: Pyodide loads this whole folder."""
