# The bench's HTTP client (drive_http) against a stand-in server: python client.py PORT 64,256,512
# (from the repository root, or with it on PYTHONPATH).
import asyncio, sys
from worker.tools.bench.servers import drive_http
rows = asyncio.run(drive_http(f"http://127.0.0.1:{sys.argv[1]}", model="m", concurrencies=[int(c) for c in sys.argv[2].split(",")], num_requests=0, max_tokens=256, headers={}))
for r in rows:
    print(r["concurrency"], round(r["throughput_tok_s"]), "tok/s", "ttft p50", r.get("ttft_p50_ms"), "itl", r.get("itl_mean_ms"))
