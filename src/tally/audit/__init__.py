"""The audit pipeline: cluster snapshots, the durability checks on Spark, reports."""
