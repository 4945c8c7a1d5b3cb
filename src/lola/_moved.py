"""Modules that moved into packages, still importable by their old names for a while.

``import lola.composer`` (or ``from lola.outputs import write_files``) keeps working: the old
name is the new module itself, found with a :class:`DeprecationWarning` that names where it
lives now.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "lola.composer": "lola.engine.composer",
    "lola.segment_reads": "lola.engine.segment_reads",
    "lola.state_pages": "lola.engine.state_pages",
    "lola.outputs": "lola.io.outputs",
    "lola.paths": "lola.io.paths",
    "lola.checksums": "lola.io.checksums",
    "lola.corpora": "lola.data.corpora",
    "lola.spec_options": "lola.cli.spec_options",
    "lola.demo": "lola.eval.demo",
    "lola.model_entry": "lola.pretrained.model_entry",
    "lola.resolve": "lola.pretrained.resolve",
    "lola.integrations.transformers.applied": "lola.integrations.transformers.model_record",
}
"""Old module name → the module it is now."""

RENAMED_KERNEL_PACKAGES = {
    "lola.kernels.chunk_linear_attention": "lola.kernels.linear_attention",
    "lola.kernels.softmax_partial": "lola.kernels.exact_attention",
    "lola.kernels.self_recall_error": "lola.kernels.recall_error",
    "lola.kernels.decode_step": "lola.kernels.decoding",
}
"""Kernel packages renamed: the old name is the op's *function* (``lola.kernels.softmax_partial``),
so it cannot alias a module too (an import would replace the function); importing a module under
it is refused with the new name."""


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):  # the moved module itself, not a copy
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:  # already executed under its new name
        pass


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds an old name of :data:`MOVED` as its new module, with a deprecation warning."""

    def find_spec(self, fullname, path=None, target=None):
        old = next((p for p in RENAMED_KERNEL_PACKAGES if fullname == p or fullname.startswith(p + ".")), None)
        if old is not None:
            new_name = RENAMED_KERNEL_PACKAGES[old] + fullname[len(old) :]
            raise ModuleNotFoundError(f"{fullname} is now {new_name} ({old} is the op's function)", name=fullname)
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import it from there (the old name will go)", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Add the finder once (``import lola`` does)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
