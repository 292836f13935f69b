"""The speculative round: capture of the target's hidden states (``capture``), the draft's tree
(``drafting``, plus prompt-lookup chains from ``lookup``), the target's verify forward and commit
(``target``), tree verification (``tree``), the acceptance bound of a sampling round
(``acceptance_bound``), and the requests and rows that a ``generate`` call advances round by
round (``batch``)."""
