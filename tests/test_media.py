"""Media URLs that cannot reach inside the host: the worker's media connector against a local
HTTP server that counts the requests it gets (no engine: vLLM's layer hands every media URL to
this connector, see the vision tests for the paths through it)."""

from __future__ import annotations

import asyncio.base_events
import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

import worker.media as media
import worker.vllm_internals.media  # registers the guarded connector; its shared client is closed below
from tests.helpers import ImageServer, engine_env, engine_kwargs, png
from worker.boot.engine_args import PUBLIC_MEDIA_CONNECTOR
from worker.config import load_settings
from worker.media import MediaURLRefused, address_refusal

PNG = png((4, 4), (200, 30, 30))


@pytest.fixture(autouse=True)
async def _shared_session_closed() -> AsyncIterator[None]:
    yield
    await worker.vllm_internals.media.close_shared_client()


@pytest.fixture
def server() -> Iterator[ImageServer]:
    s = ImageServer(PNG)
    yield s
    s.close()


def _connector(name: str = PUBLIC_MEDIA_CONNECTOR, **kwargs: Any) -> Any:
    return MEDIA_CONNECTOR_REGISTRY.load(name, **kwargs)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped IPv6
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1%eth0", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "not public"),  # shared address space (carrier-grade NAT)
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_refusal(address: str, why: str | None) -> None:
    assert address_refusal(address) == why


async def test_inside_addresses_are_refused_before_any_connection(server: ImageServer) -> None:
    connector = _connector()
    for url in (
        server.url(),
        server.url(host="localhost"),  # a name that resolves to loopback
        server.url(host="[::ffff:127.0.0.1]"),
        f"http://0.0.0.0:{server.port}/img.png",
    ):
        with pytest.raises(MediaURLRefused, match=r"media URL refused: host .* address; set ALLOW_PRIVATE_MEDIA_URLS"):
            await connector.fetch_image_async(url)
    assert server.hits == []
    # The control: vLLM's own connector fetches the same URL (the server answers; the guard refused).
    image = await _connector("http").fetch_image_async(server.url())
    assert image.size == (4, 4) and server.hits == ["/img.png"]


async def test_the_metadata_address_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused before any connection is attempted (none could be: every one is recorded and refused).
    attempts: list[Any] = []

    async def no_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("no connection in this test")

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "create_connection", no_connection)
    with pytest.raises(MediaURLRefused, match=r"169\.254\.169\.254 is a link-local address"):
        await _connector().fetch_image_async("http://169.254.169.254/latest/meta-data/iam/")
    assert attempts == []


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("ftp://example.com/a.png", "scheme 'ftp' is not allowed"),
        ("gopher://example.com/", "scheme 'gopher' is not allowed"),
        ("http:///a.png", "names no host"),
        ("http://no-such-host.invalid/a.png", "does not resolve"),
    ],
)
async def test_other_schemes_and_bad_hosts_are_refused(url: str, match: str) -> None:
    with pytest.raises(MediaURLRefused, match=match):
        await _connector().fetch_image_async(url)
    with pytest.raises(MediaURLRefused, match=match):  # the synchronous path says the same
        _connector().fetch_image(url)


async def test_data_urls_still_load() -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert (await _connector().fetch_image_async(url)).size == (4, 4)


async def test_redirects_are_not_followed(server: ImageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With loopback counted as public for this test only (so the first request goes out), a
    redirect is refused and its target never fetched, on both paths."""
    monkeypatch.setattr(media, "address_refusal", lambda address: None)
    target = server.url()
    refused = f"redirect \\(HTTP 302 to {target}\\)"
    with pytest.raises(MediaURLRefused, match=refused):
        await _connector().fetch_image_async(server.url("/to?" + target))
    assert server.hits == ["/to?" + target]
    with pytest.raises(MediaURLRefused, match=refused):
        _connector().fetch_image(server.url("/to?" + target))
    assert server.hits == ["/to?" + target] * 2


async def test_a_name_that_resolves_elsewhere_at_fetch_time_is_refused(
    server: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the check's lookup says public (patched here), the fetch's lookup says
    loopback; the fetch's resolver refuses it before connecting."""

    async def public(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    monkeypatch.setattr(media, "lookup_async", public)
    with pytest.raises(MediaURLRefused, match=r"host localhost \((127\.0\.0\.1|::1)\) is a loopback address"):
        await _connector().fetch_image_async(server.url(host="localhost"))
    assert server.hits == []


async def test_allowed_media_domains_still_apply() -> None:
    with pytest.raises(ValueError, match="allowed domains"):
        await _connector(allowed_media_domains=["images.example.com"]).fetch_image_async("http://8.8.8.8/a.png")


def test_settings_select_the_connector_and_the_domains() -> None:
    base = {"MODEL_NAME": "tiny:target"}
    settings = load_settings({**base, "ALLOWED_MEDIA_DOMAINS": "Images.Example.com, cdn.example.com"})
    assert settings.allowed_media_domains == ["images.example.com", "cdn.example.com"]
    kwargs = engine_kwargs(settings)
    assert kwargs["allowed_media_domains"] == ["images.example.com", "cdn.example.com"]
    assert engine_env(settings, mode="pod")["VLLM_MEDIA_CONNECTOR"] == PUBLIC_MEDIA_CONNECTOR
    private = load_settings({**base, "ALLOW_PRIVATE_MEDIA_URLS": "true"})
    assert engine_env(private, mode="serverless")["VLLM_MEDIA_CONNECTOR"] is None  # vLLM's own
    assert "allowed_media_domains" not in engine_kwargs(private)
