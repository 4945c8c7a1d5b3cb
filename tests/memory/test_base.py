"""The capabilities a memory declares, which the engine asks instead of its type."""


def test_capabilities_are_declared_and_an_override_that_does_not_declare_loses_them():
    """The engine asks a memory what it can do (`reads_block`, `binds`, `snapshots`,
    `sums_features`, `ring`),
    never its type: the stock memories declare it, a subclass that overrides what a capability
    rests on loses it unless it declares it again."""
    from lola.memory import LinearState, SlidingWindow, SparseCache

    assert SparseCache.reads_block and SparseCache.binds and LinearState.snapshots and LinearState.sums_features and SlidingWindow.ring

    class OwnRead(SparseCache):
        def read(self, query, keep_logits=False):
            return super().read(query, keep_logits)

    class OwnReadDeclared(OwnRead):
        reads_block = True

        def read(self, query, keep_logits=False):
            return super().read(query, keep_logits)

    class OwnStorage(SparseCache):
        def allocate(self, *args):
            return super().allocate(*args)

    class OwnWrite(LinearState):
        def write(self, *args, **kwargs):
            return super().write(*args, **kwargs)

    class OwnRing(SlidingWindow):
        def push(self, *args):
            return super().push(*args)

    assert not OwnRead.reads_block and OwnRead.binds
    assert OwnReadDeclared.reads_block
    assert OwnStorage.reads_block and not OwnStorage.binds
    assert not OwnWrite.snapshots and not OwnWrite.sums_features and not OwnRing.ring and SlidingWindow(4, 2).ring
