"""Auto-recovery: the elected auditor and the replication workers (seed 004)."""
