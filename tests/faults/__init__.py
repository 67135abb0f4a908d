"""Every named fault through one scriptable layer and one invariant check."""
