"""Date formats for the operator's pages: times to the second, in ISO order (FORMAT_MODULE_PATH)."""
