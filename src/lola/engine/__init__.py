"""The inference engine: a layer's state, the block loop of prefill and decode, the select-and-evict step, and state held in external pages."""
