"""Issue 7: every named fault through one scriptable layer and one invariant check."""
