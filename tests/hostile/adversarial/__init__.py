"""An adversarial pass over lola: hostile inputs of seven classes, each outcome classified.

A measurement, not a test suite: ``python -m tests.hostile.adversarial`` runs the cases of
:mod:`.cases` and prints a table (see README.md beside this file).
"""
