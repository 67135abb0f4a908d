"""The operation ledger: models, the state table, guarded transitions, acceptance and the outbox.

Imports nothing from `toolops` or `adapters`: the data layer stands on its own.
"""
