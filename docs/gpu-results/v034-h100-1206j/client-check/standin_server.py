# A stand-in (fake) OpenAI completions SSE server, raw asyncio: 256 events a request.
#   python standin_server.py PORT        as fast as the socket takes them (a drain every 8 events)
#   python standin_server.py PORT STEP   one event every STEP seconds a stream (0.010 for 256 streams,
#                                        0.017 for 512: the GPU's step there)
import asyncio, json, sys
N = 256
STEP = float(sys.argv[2]) if len(sys.argv) > 2 else None
ev = 'data: ' + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m", "choices": [{"index": 0, "text": " w1", "logprobs": None, "finish_reason": None, "stop_reason": None}], "usage": None}) + '\n\n'
last = 'data: ' + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 8, "total_tokens": 264, "completion_tokens": N}}) + '\n\ndata: [DONE]\n\n'
def chunk(s):
    b = s.encode(); return b"%x\r\n" % len(b) + b + b"\r\n"
CH, LAST = chunk(ev), chunk(last) + b"0\r\n\r\n"
async def handle(r, w):
    try:
        while True:
            line = await r.readline()
            if not line: return
            length = 0
            while True:
                h = await r.readline()
                if h.lower().startswith(b"content-length:"): length = int(h.split(b":")[1])
                if h in (b"\r\n", b""): break
            if length: await r.readexactly(length)
            if line.startswith(b"GET"):
                body = b"vllm:generation_tokens_total 0\n"
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body); await w.drain(); continue
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(N):
                w.write(CH)
                if STEP is not None or i % 8 == 7:
                    await w.drain(); await asyncio.sleep(STEP or 0)
            w.write(LAST); await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with s: await s.serve_forever()
asyncio.run(main())
