"""The environment as an HTTP service (``seal serve``, ``service.app.create_app``) and its clients.

>>> from seal_rl.service import Client, RemoteEnv   # doctest: +SKIP
"""

from seal_rl.service.client import AsyncClient, Client, RemoteEnv, ServiceError

__all__ = ["AsyncClient", "Client", "RemoteEnv", "ServiceError"]
