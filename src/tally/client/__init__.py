"""The asyncio client: moves the bytes that `tally.core` encodes, to and from bookies."""
