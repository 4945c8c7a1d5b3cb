"""Integrations of lola with other libraries (import the submodule you need)."""
