"""The package version (pyproject.toml's), in a module of its own so that any module can read it
while the package is still loading."""

__version__ = "0.1.0"
