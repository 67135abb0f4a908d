"""Guarded writes to the ledger. Every function here changes rows only through checked SQL."""
