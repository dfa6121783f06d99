"""The pure half of the chaos suite (issue 19): the history a run writes, and the checker
that judges it against the invariants of BookKeeper's protocol and seed 003."""
