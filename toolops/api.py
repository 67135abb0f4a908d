"""`toolops.api`: the stable import path of the Python embedding API (toolops/python_api.py).

Host applications write `from toolops import api`; the functions and types live in
`toolops.python_api` (the in-process API), beside `toolops.rest` (the HTTP API built on it).
"""

from toolops import python_api as _python_api
from toolops.python_api import *  # noqa: F403

__all__ = list(_python_api.__all__)
