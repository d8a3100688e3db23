"""File-format readers that need only the Python standard library (usable inside Pyodide)."""
