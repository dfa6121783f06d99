"""Metadata recovery (issue 18): rebuild a lost metadata store from what the bookies hold.

exports.py writes one Parquet file per bookie, from a running bookie's dump WITH_STATE or a
stopped bookie's files (stopped_bookie.py); job.py joins them on Spark and decides each
ledger (core/metadata_recovery.py); apply.py writes the result into a store and recovers
the ledgers that come back OPEN.
"""
