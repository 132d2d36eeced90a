"""Media URLs that cannot reach inside the host: vLLM's media connector behind an address guard.

vLLM's OpenAI layer fetches every ``image_url`` / ``audio_url`` / ``video_url`` a client sends
(for a multimodal model), following redirects and with no address filter. Anyone who can send a
request could make the worker fetch the cloud metadata service (``169.254.169.254``), the host's
own services on loopback, or private addresses, and read timing or errors back. vLLM offers the
hooks, not the policy: a registry of media connectors chosen by ``VLLM_MEDIA_CONNECTOR``, and
``allowed_media_domains`` (an allow-list of host names; the worker's ``ALLOWED_MEDIA_DOMAINS``).
The seam (:mod:`worker.vllm_internals.media`) registers ``PublicMediaConnector``, vLLM's connector
with this module's guard, which the worker selects by default
(``worker.boot.engine_args.engine_environment``) for every path that reaches vLLM's layer (the pod
and ``openai_route``; the native input takes no media):

- before any connection, a URL is refused unless its scheme is ``http``, ``https`` or ``data``
  (``file`` only where vLLM's ``allowed_local_media_path`` is set) and every address its host
  resolves to is public: loopback, private, link-local (the metadata address), shared (CGNAT),
  multicast, reserved and unspecified addresses are refused, IPv4-mapped IPv6 included;
- the fetch connects only to addresses that pass the same test (the client's resolver checks
  them again, so a name that resolves to a public address for the check and to a private one
  for the fetch, DNS rebinding, is refused too); a proxy from the environment is exempt;
- redirects are not followed (a redirect could name any address): a 3xx answer is refused, with
  the place it pointed to, so the client can send that URL instead.

A refusal is a validation error with a sentence saying why, which vLLM's layer answers with a 400.
``ALLOW_PRIVATE_MEDIA_URLS=true`` (for images served from the user's own network) selects vLLM's
own connector instead, with vLLM's own redirect setting. Written here because vLLM has no address
filter; vLLM's connector does all the fetching and decoding. Imports vLLM's exceptions module (its
public surface): loaded only by the seam's connector.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.request
from collections.abc import Iterable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from urllib3.util import parse_url
from vllm.exceptions import VLLMValidationError

from worker.config.settings import PUBLIC_MEDIA_CONNECTOR

__all__ = [
    "PUBLIC_MEDIA_CONNECTOR",
    "MediaURLRefused",
    "PublicResolver",
    "address_refusal",
    "check_literal",
    "http_host",
    "lookup",
    "lookup_async",
    "proxy_hosts",
    "redirect_refusal",
    "refuse_addresses",
    "refuse_redirects",
]


class MediaURLRefused(VLLMValidationError):
    """A media URL the worker will not fetch; the message says why. A vLLM validation error (vLLM's
    public exception): vLLM's layer passes it through as a 400 with its message (a ``ValueError``
    raised during a fetch it would turn into "Invalid URL")."""


_HINT = "set ALLOW_PRIVATE_MEDIA_URLS=true to serve media from your own network"


def address_refusal(address: str) -> str | None:
    """Why the worker will not connect to ``address`` (None: a public address it may)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone index is not part of it
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:
        return "not public"
    return None


def refuse_addresses(host: str, addresses: Iterable[str]) -> None:
    for address in addresses:
        why = address_refusal(address)
        if why is not None:
            shown = host if host == address else f"{host} ({address})"
            raise MediaURLRefused(f"media URL refused: host {shown} is a {why} address; {_HINT}")


def http_host(url: str, *, allow_file: bool) -> tuple[str, int] | None:
    """The host and port a media URL would connect to (None: it connects nowhere: ``data:``,
    or ``file:`` where vLLM allows local files); refuses other schemes."""
    if url[:5].lower() == "data:":
        return None
    try:
        spec = parse_url(url)
    except Exception:
        raise MediaURLRefused("media URL refused: not a valid URL") from None
    scheme = (spec.scheme or "").lower()
    if scheme == "file" and allow_file:
        return None
    if scheme not in ("http", "https"):
        raise MediaURLRefused(
            f"media URL refused: scheme {scheme or '(none)'!r} is not allowed (use http, https or a data: URL)"
        )
    if not spec.hostname:
        raise MediaURLRefused("media URL refused: it names no host")
    return spec.hostname.strip("[]"), spec.port or (443 if scheme == "https" else 80)


def check_literal(host: str) -> bool:
    """Refuse an IP-literal host at once; True when ``host`` is a literal (no lookup needed)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    refuse_addresses(host, [host])
    return True


def _unresolved(host: str, exc: OSError) -> MediaURLRefused:
    return MediaURLRefused(f"media URL refused: host {host} does not resolve ({exc.strerror or exc})")


class PublicResolver(AbstractResolver):
    """aiohttp's resolver, passing only public addresses (proxy hosts from the environment exempt):
    the addresses a fetch connects to pass the same test as the URL did."""

    def __init__(self, exempt: set[str]) -> None:
        self._inner = aiohttp.DefaultResolver()
        self._exempt = exempt

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if host not in self._exempt:
            refuse_addresses(host, [r["host"] for r in found])
        return found

    async def close(self) -> None:
        await self._inner.close()


async def refuse_redirects(response: aiohttp.ClientResponse) -> None:
    if 300 <= response.status < 400:
        raise redirect_refusal(response.status, response.headers.get("Location"))


def redirect_refusal(status: int, location: str | None) -> MediaURLRefused:
    return MediaURLRefused(
        f"media URL refused: it answered with a redirect (HTTP {status} to {location or 'nowhere'}), "
        "which the worker does not follow; send the final URL"
    )


def proxy_hosts() -> set[str]:
    hosts = set()
    for url in urllib.request.getproxies().values():
        try:
            host = parse_url(url).hostname
        except Exception:
            continue
        if host:
            hosts.add(host)
    return hosts


def lookup(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _unresolved(host, exc) from None
    return [str(info[4][0]) for info in infos]


async def lookup_async(host: str, port: int) -> list[str]:
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _unresolved(host, exc) from None
    return [str(info[4][0]) for info in infos]
