"""The reference MCP server: the official `mcp` SDK (1.30) with its experimental task support.

The demo (`manage.py toolops demo`) runs against it, and the tests use it as the real Shape A
peer. It needs the optional extra (`pip install "toolops[reference-server]"`, which brings `mcp`
and `uvicorn`); nothing else in toolops imports it.

Run: python -m toolops.reference_server --port PORT [--host 127.0.0.1] [--cooperating [full|dedup]]
     [--poll-interval-ms N]
MCP endpoint: /mcp. Inspection routes: GET /_peer/stats, POST /_peer/reset, GET /_peer/lookup?key=K.
Cooperating mode declares `capabilities.experimental["io.toolops/submission-key"]`: `dedup`
(tools/call with a key already used in this session answers the same task, never a second one)
and, in `full` mode, `lookup` (POST /_peer/keys {"key"}: the task for the key, or a 404 that
FENCES the key so that a late tools/call carrying it is refused: proof that nothing exists).

`toolops.reference_server.launch` starts it as a subprocess and needs only httpx.
"""

import warnings

# The SDK's whole experimental tasks API is deprecated in 1.30 (removal planned for mcp 2.0); the
# reference server uses it on purpose, so keep that warning out of every log.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"toolops\.reference_server(\.|$)")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mcp\.")
