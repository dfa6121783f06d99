"""The pure core: every decision of tally as functions and small state machines.

No I/O and no asyncio here, so that the hard parts are testable under hypothesis and the
same code serves the bookie, the client, the auditor and the Spark pipeline.
"""
