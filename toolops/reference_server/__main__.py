"""`python -m toolops.reference_server --port PORT`: serve the reference MCP server."""

from toolops.reference_server.app import main

main()
