"""Images in: ``tiny:vision`` (Idefics3 over the tiny text model, no torchvision) served with
image parts through the pod app and the handler's openai_route, from ``data:`` URLs and from a
loopback HTTP server that counts what it is asked for.

One real CPU engine serves every test here: the pod app is driven in-process through httpx's ASGI
transport, the route through the handler. The engine boots with the worker's media guard on (the
default); the test that fetches from the loopback server applies what ``ALLOW_PRIVATE_MEDIA_URLS``
sets (vLLM's layer reads ``VLLM_MEDIA_CONNECTOR`` in this process on every request that carries
media), and ``ALLOWED_MEDIA_DOMAINS`` admits 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import ImageServer, boot_engine, engine_env, job_items, png, worker_for
from worker.config import load_settings
from worker.pod import create_app
from worker.serverless import ServerlessWorker
from worker.tiny_models import TinyModels, ensure_tiny_model

pytestmark = pytest.mark.slow  # every test here boots an engine or a server

MODEL = "tiny:vision"
ENV = {"MODEL_NAME": MODEL, "ALLOWED_MEDIA_DOMAINS": "127.0.0.1"}
RED = png((40, 30), (220, 30, 30))
BLUE = png((40, 30), (30, 40, 220))
WIDE = png((64, 20), (30, 200, 40))  # another shape: fewer tiles, fewer image tokens


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def chat(url: str, **options: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 6, "temperature": 0}
    return {**body, **options}


class Vision:
    """The same OpenAI request through the pod app or the handler's openai_route."""

    def __init__(self, worker: ServerlessWorker) -> None:
        self.worker = worker
        app = create_app(worker.holder, boot_on_startup=False)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod", timeout=120)

    async def pod(self, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post("/v1/chat/completions", json=body)

    async def route(self, body: dict[str, Any] | None, path: str = "/v1/chat/completions") -> Any:
        """The route's only item: a response object, or an error item."""
        job_input: dict[str, Any] = {"openai_route": path}
        if body is not None:
            job_input["openai_input"] = body
        (item,) = await job_items(self.worker, {"id": "vision", "input": job_input})
        return item

    async def both(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The answers of both paths, each checked to be a 200."""
        response = await self.pod(body)
        assert response.status_code == 200, response.text
        item = await self.route(body)
        assert "error" not in item, item
        return [response.json(), item]


@pytest.fixture(scope="module")
async def vision(tiny_models: TinyModels) -> AsyncIterator[Vision]:
    engine = await boot_engine(tiny_models, **ENV)
    worker = worker_for(engine, **ENV)
    await worker.holder.openai()
    yield Vision(worker)
    engine.shutdown()


@pytest.fixture
def server() -> Iterator[ImageServer]:
    s = ImageServer(RED)
    yield s
    s.close()


@functools.cache
def num_image_tokens(image: bytes) -> int:
    """The tokens transformers' own Idefics3 processor (its PIL backend) expands ``image`` into:
    its image tokens and their markers, what vLLM reports as the prompt's multimodal tokens."""
    from PIL import Image
    from transformers import AutoProcessor

    directory = ensure_tiny_model(load_settings().worker_cache_dir, "vision")
    processor = AutoProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
    pixels = Image.open(io.BytesIO(image))
    return len(processor(text=["<image>"], images=[[pixels]], add_special_tokens=False)["input_ids"][0])


def first_token_logprobs(answer: dict[str, Any]) -> list[tuple[str, float]]:
    (first, *_) = answer["choices"][0]["logprobs"]["content"]
    return [(top["token"], top["logprob"]) for top in first["top_logprobs"]]


async def test_served_as_tiny_vision_without_speculation(vision: Vision) -> None:
    listed = await vision.http.get("/v1/models")
    assert [m["id"] for m in listed.json()["data"]] == [MODEL]
    assert [m["id"] for m in (await vision.route(None, "/v1/models"))["data"]] == [MODEL]
    served = vision.worker.holder.ready_engine().served
    assert served.model == MODEL and served.speculative_method is None and not served.spec_decode_available


async def test_a_data_url_image_is_answered_on_pod_and_route(vision: Vision) -> None:
    """The image reaches the model: vLLM counts as many image tokens as transformers' processor
    makes of it, and another picture changes the first token's distribution (same picture, same
    distribution, on both paths). Served without drafts: no speculation stats, no error."""
    options = {"logprobs": True, "top_logprobs": 3}
    red_pod, red_route = await vision.both(chat(data_url(RED), **options))
    for answer in (red_pod, red_route):
        assert answer["model"] == MODEL
        assert answer["choices"][0]["message"]["content"]
        assert answer["usage"]["prompt_tokens_details"]["multimodal_tokens"] == {"image": num_image_tokens(RED)}
        assert answer["metrics"]["speculative_decoding"] is None  # no speculation: timings, no stats block
    assert first_token_logprobs(red_pod) == first_token_logprobs(red_route)
    assert red_pod["choices"][0]["message"]["content"] == red_route["choices"][0]["message"]["content"]
    (blue, _) = await vision.both(chat(data_url(BLUE), **options))
    assert first_token_logprobs(blue) != first_token_logprobs(red_pod)
    (wide, _) = await vision.both(chat(data_url(WIDE)))
    tokens = wide["usage"]["prompt_tokens_details"]["multimodal_tokens"]["image"]
    assert tokens == num_image_tokens(WIDE) < num_image_tokens(RED)


async def test_a_streamed_answer_through_the_route(vision: Vision) -> None:
    items = await job_items(
        vision.worker,
        {
            "id": "stream",
            "input": {"openai_route": "/v1/chat/completions", "openai_input": chat(data_url(RED), stream=True)},
        },
    )
    assert all(isinstance(item, str) for item in items), items
    assert items[-1].endswith("data: [DONE]\n\n") and '"content":' in items[0] + items[-1]


async def test_an_allowed_http_url_is_fetched_when_private_urls_are_allowed(
    vision: Vision, server: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ALLOW_PRIVATE_MEDIA_URLS=true (vLLM's own fetching), a URL on a host ALLOWED_MEDIA_DOMAINS
    names is fetched and answered exactly as the same picture sent as a data: URL; a host it does
    not name is refused before any fetch."""
    private = load_settings({**ENV, "ALLOW_PRIVATE_MEDIA_URLS": "true"})
    for key, value in engine_env(private, mode="serverless").items():
        if key == "VLLM_MEDIA_CONNECTOR":
            assert value is None  # vLLM's own connector
            monkeypatch.delenv(key, raising=False)
    options = {"logprobs": True, "top_logprobs": 3}
    fetched = await vision.both(chat(server.url(), **options))
    assert server.hits == ["/img.png", "/img.png"]
    (inline, _) = await vision.both(chat(data_url(RED), **options))
    for answer in fetched:
        assert first_token_logprobs(answer) == first_token_logprobs(inline)
        assert answer["usage"]["prompt_tokens_details"]["multimodal_tokens"] == {"image": num_image_tokens(RED)}

    other_name = chat(server.url(host="localhost"))
    response = await vision.pod(other_name)
    assert response.status_code == 400 and "allowed domains" in response.json()["error"]["message"]
    item = await vision.route(other_name)
    assert item["status"] == 400 and "allowed domains" in item["error"]
    assert server.hits == ["/img.png", "/img.png"]


async def test_urls_inside_the_host_are_refused_with_zero_fetches(vision: Vision, server: ImageServer) -> None:
    """The worker's guard (on by default) refuses before any connection, whatever ALLOWED_MEDIA_DOMAINS
    says (127.0.0.1 is allowed there): a 400 that says why on both paths, and the server asked nothing."""
    refused = {
        server.url(): "127.0.0.1 is a loopback address",
        server.url(host="localhost"): r"localhost (127.0.0.1) is a loopback address",
        server.url(host="[::ffff:127.0.0.1]"): "is a loopback address",
        server.url("/to?http://169.254.169.254/latest/meta-data/"): "127.0.0.1 is a loopback address",
        "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a link-local address",
        "http://10.0.0.1/img.png": "10.0.0.1 is a private address",
        "http://192.168.1.1/img.png": "192.168.1.1 is a private address",
    }
    for url, why in refused.items():
        response = await vision.pod(chat(url))
        assert response.status_code == 400, (url, response.text)
        message = response.json()["error"]["message"]
        assert message.startswith("media URL refused: host ") and why in message, (url, message)
        item = await vision.route(chat(url))
        assert item["status"] == 400 and why in item["error"] and "\n" not in item["error"], (url, item)
    assert server.hits == []
    ok = await vision.pod(chat(data_url(RED)))  # and the worker keeps serving
    assert ok.status_code == 200


async def test_native_input_serves_text_and_names_image_parts_as_unsupported(vision: Vision) -> None:
    """The native input takes text only (its messages' content is a string): an image part gets a
    one-line error naming the field; a text request is served, without speculation stats."""
    text = {"messages": [{"role": "user", "content": "Tell me a story."}], "sampling_params": {"max_tokens": 8}}
    items = await job_items(vision.worker, {"id": "native", "input": {**text, "stream": False}})
    (final,) = items
    assert final["text"] and final["spec_decode"] is None and final["served"]["model"] == MODEL
    content = [{"type": "image_url", "image_url": {"url": data_url(RED)}}]
    job = {"messages": [{"role": "user", "content": content}]}
    (error,) = await job_items(vision.worker, {"id": "native-image", "input": job})
    assert error["error_type"] == "invalid_request_error", error
    assert error["error"].startswith("messages.0.content") and "\n" not in error["error"], error
