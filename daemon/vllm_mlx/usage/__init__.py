"""Usage accounting: what each key spent, per model, route and UTC day.

record.py is what one request spent (filled in as it runs), ledger.py adds requests up
in memory, enforces the token quotas and hands batches to store.py, the SQLite file
that outlives the daemon. Nothing here imports the API layer or the engine.
"""
