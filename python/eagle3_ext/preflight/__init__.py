"""What is checked before a generator runs: whether the target's architecture can be served exactly
(``architecture``), whether a call fits in memory (``memory``), and loading a target and its draft
with one-line errors for the usual mistakes (``loading``)."""
