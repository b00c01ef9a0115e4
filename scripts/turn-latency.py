#!/usr/bin/env python3
# Turn latency: one connection, one session, 300 session/prompt "hello" back to
# back on one keep-alive HTTP connection (the first 50 dropped); prints p50/p90.
# usage: scripts/turn-latency.py BINARY STORE   (STORE: memory, or sqlite:DIR/s.db;
# DIR is replaced by a fresh temp dir). research/benchmarks.md, issue 23.
import http.client, json, subprocess, sys, time, tempfile, os, statistics, re, signal
binary, store = sys.argv[1], sys.argv[2]
d = tempfile.mkdtemp()
st = store.replace("DIR", d)
p = subprocess.Popen([binary, "server", "--no-token", "--port", "0", "--data-dir", d, "--store", st], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = p.stdout.readline()
port = int(re.search(r":(\d+)", line).group(1))
c = http.client.HTTPConnection("127.0.0.1", port)
def post(body, conn=None):
    h = {"content-type": "application/json"}
    if conn: h["x-acp-connection-id"] = conn
    c.request("POST", "/v2/rpc", json.dumps(body), h)
    r = c.getresponse(); data = r.read()
    return r, json.loads(data) if data else None
r, _ = post({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"_meta":{"sandboxagent.dev":{"agent":"mock"}}}})
conn = r.getheader("x-acp-connection-id")
_, b = post({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[],"_meta":{"sandboxagent.dev":{"agent":"mock"}}}}, conn)
s = b["result"]["sessionId"]
lat = []
for i in range(300):
    t = time.perf_counter()
    _, b = post({"jsonrpc":"2.0","id":10+i,"method":"session/prompt","params":{"sessionId":s,"prompt":[{"type":"text","text":"hello"}]}}, conn)
    lat.append((time.perf_counter()-t)*1000)
    assert b["result"]["stopReason"] == "end_turn", b
lat = lat[50:]
lat.sort()
print(f"p50 {lat[len(lat)//2]:.2f} ms  p90 {lat[int(len(lat)*.9)]:.2f} ms  n={len(lat)}")
p.send_signal(signal.SIGTERM); p.wait()
subprocess.run(["rm","-rf",d])
