"""Median time of one `tools/call` on one streamable-HTTP session (keep-alive, one call at a time).

Usage: start `callid probe --http 127.0.0.1:PORT`, then `python3 benches/http_session_latency.py
127.0.0.1 PORT [CALLS]`. Prints the median and 90th percentile in milliseconds and the reply's
content type (rmcp answers with SSE by default).
"""
import http.client, json, sys, time, statistics
host, port = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
c = http.client.HTTPConnection(host, port)
def post(body, session=None, version=None):
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session: h["mcp-session-id"] = session
    if version: h["mcp-protocol-version"] = version
    c.request("POST", "/mcp", json.dumps(body), h)
    r = c.getresponse()
    data = r.read()
    return r, data
r, d = post({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"b","version":"1"}}})
sid = r.getheader("mcp-session-id")
post({"jsonrpc":"2.0","method":"notifications/initialized"}, sid, "2025-06-18")
ts = []
for i in range(n):
    t = time.perf_counter()
    r, d = post({"jsonrpc":"2.0","id":i+1,"method":"tools/call","params":{"name":"capabilities","arguments":{},"_meta":{"callId":"call_%d"%i}}}, sid, "2025-06-18")
    ts.append(time.perf_counter()-t)
    assert b"result" in d, d
print("median ms %.2f  p90 %.2f" % (statistics.median(ts)*1000, sorted(ts)[int(n*.9)]*1000), r.getheader("content-type"))
