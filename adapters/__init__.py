"""Protocol adapters: plain Python (httpx + mcp-types), no Django, no ledger, no toolops.

One interface (`TaskAdapter`), one module per protocol shape, one error taxonomy.
"""

from adapters.aip151 import Aip151Adapter
from adapters.base import (
    FetchedResult,
    InputWindow,
    Negotiated,
    RemoteTask,
    ServerRequest,
    SubmitOutcome,
    TaskAdapter,
    ToolDescriptor,
)
from adapters.errors import (
    AdapterError,
    AlreadyTerminalError,
    LostResponseError,
    NeverCreatedError,
    NotFoundError,
    ProtocolViolationError,
    SessionLostError,
    TaskNotSupportedError,
    TransientError,
)
from adapters.mcp_tasks_2025 import McpTasks2025Adapter
from adapters.mcp_tasks_2025_inputs import close_input_streams
from adapters.mcp_tasks_ext_2026 import McpTasksExt2026Adapter
from adapters.registry import ADAPTER_VERSIONS, adapter_for

__all__ = [
    "ADAPTER_VERSIONS",
    "AdapterError",
    "Aip151Adapter",
    "AlreadyTerminalError",
    "FetchedResult",
    "InputWindow",
    "LostResponseError",
    "McpTasks2025Adapter",
    "McpTasksExt2026Adapter",
    "Negotiated",
    "NeverCreatedError",
    "NotFoundError",
    "ProtocolViolationError",
    "RemoteTask",
    "ServerRequest",
    "SessionLostError",
    "SubmitOutcome",
    "TaskAdapter",
    "TaskNotSupportedError",
    "ToolDescriptor",
    "TransientError",
    "adapter_for",
    "close_input_streams",
]
