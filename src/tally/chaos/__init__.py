"""The chaos harness of issue 19: a local cluster under faults, its workload, and the
history it writes."""
