"""A streamer that records what ``generate`` hands it, for tests of the streaming contract."""


class RecordingStreamer:
    """Keeps every ``put`` (a copy of the tensor) and whether ``end`` was called."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended = True

    @property
    def chunks(self):
        """The puts as nested lists."""
        return [p.tolist() for p in self.puts]
