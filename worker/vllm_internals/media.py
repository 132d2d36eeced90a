"""vLLM's media connector and its HTTP client, subclassed to run the worker's address guard
(:mod:`worker.media`, which says why) before any fetch and on every address a fetch connects to, and
to follow no redirect."""

from __future__ import annotations

from typing import Any

import aiohttp
import requests
from vllm.connections import HTTPConnection
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaConnector

from worker import media as guard
from worker.config.settings import PUBLIC_MEDIA_CONNECTOR

__all__ = ["PublicHTTPConnection", "PublicMediaConnector", "close_shared_client"]


class PublicHTTPConnection(HTTPConnection):
    """vLLM's HTTP client for media, connecting only to public addresses and not following redirects."""

    async def get_async_client(self) -> aiohttp.ClientSession:
        if self._async_client is None or not self.reuse_client:
            connector = aiohttp.TCPConnector(resolver=guard.PublicResolver(guard.proxy_hosts()))
            self._async_client = aiohttp.ClientSession(
                trust_env=True, connector=connector, raise_for_status=guard.refuse_redirects
            )
        return self._async_client

    def get_response(self, url: str, **kwargs: Any) -> requests.Response:
        kwargs["allow_redirects"] = False
        response: requests.Response = super().get_response(url, **kwargs)
        if response.is_redirect:
            response.close()
            raise guard.redirect_refusal(response.status_code, response.headers.get("Location"))
        return response

    async def get_async_response(self, url: str, **kwargs: Any) -> Any:
        kwargs["allow_redirects"] = False
        return await super().get_async_response(url, **kwargs)


_CONNECTION = PublicHTTPConnection()


async def close_shared_client() -> None:
    """Close the connectors' shared aiohttp session, if one was made. Shared as vLLM's own
    (``reuse_client``), it is made on the event loop of its first fetch and never closed: a caller
    whose loop ends first (a test's) closes it here, or aiohttp warns "Unclosed client session"
    when it is collected."""
    if _CONNECTION._async_client is not None:
        await _CONNECTION._async_client.close()
        _CONNECTION._async_client = None


@MEDIA_CONNECTOR_REGISTRY.register(PUBLIC_MEDIA_CONNECTOR)
class PublicMediaConnector(MediaConnector):
    """vLLM's media connector, refusing URLs that reach loopback, private or link-local addresses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("connection", _CONNECTION)
        super().__init__(*args, **kwargs)

    def _target(self, url: str) -> tuple[str, int] | None:
        """The host name and port to look up before fetching ``url`` (None: nothing to look up)."""
        target = guard.http_host(url, allow_file=self.allowed_local_media_path is not None)
        if target is None or guard.check_literal(target[0]):
            return None
        return target

    def load_from_url(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        target = self._target(url)
        if target is not None:
            guard.refuse_addresses(target[0], guard.lookup(*target))
        return super().load_from_url(url, media_io, fetch_timeout=fetch_timeout)

    async def load_from_url_async(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        target = self._target(url)
        if target is not None:
            guard.refuse_addresses(target[0], await guard.lookup_async(*target))
        return await super().load_from_url_async(url, media_io, fetch_timeout=fetch_timeout)
