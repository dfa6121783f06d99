"""The `tally` command: every process and tool of tally starts here."""
