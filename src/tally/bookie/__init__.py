"""The bookie: a storage server that journals, stores and serves ledger entries."""
