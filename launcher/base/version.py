"""affrun's version, where every module can import it (pyproject.toml states the same number)."""

__version__ = "0.1.0"
