"""``compile=True`` or a ``CompileOptions`` (``options``): a generator's compiled graphs (``graphs``),
the target's verify forward (``verify``; as AOTInductor packages on disk: ``packages``), the draft's
side of a round (``draft``) and the cache buffers kept from one call to the next (``buffer_pool``)."""
