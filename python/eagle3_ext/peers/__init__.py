"""Other implementations the library measures itself against (optional dependencies)."""
