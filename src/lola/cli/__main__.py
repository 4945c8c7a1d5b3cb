"""``python -m lola.cli``: the ``lola`` command."""

from lola.cli import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
