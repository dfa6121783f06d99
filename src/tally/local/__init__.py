"""A whole tally cluster on one machine: `tally local up | status | stop | start-bookie`.

Everything lives in one data directory: the embedded sqlite metadata store, one directory
and one log per bookie, and `local.json`, the supervisor's record of what it runs, so that
commands from another shell can find, inspect and stop the cluster.
"""
