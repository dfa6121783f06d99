"""The admin HTTP face of tally's long-running processes (see `tally.http.admin`)."""
