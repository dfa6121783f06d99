"""The bookie: a storage server that journals, stores and serves ledger entries."""

EXIT_SESSION_LOST = 75
"""The exit status of a bookie process that stopped because it lost its metadata store
session (paused or cut off for longer than its session timeout): its registration is gone,
and a new start (with a new session) is what it needs, so a supervisor may restart it.
75 is sysexits' EX_TEMPFAIL; a bookie that cannot start exits with 2."""
