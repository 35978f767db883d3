"""The in-process API's import path: `from shmserve.server import Options, Server`.

The server itself is host/server.py; applications that embed shmserve import it from here.
"""

from shmserve.host.server import Options, Server, StartupError

__all__ = ["Options", "Server", "StartupError"]
