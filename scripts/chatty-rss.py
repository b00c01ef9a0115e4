#!/usr/bin/env python3
# Peak RSS of twelve chatty sessions under one memory budget
# (research/benchmarks.md, "One number bounds memory").
#
# Starts BINARY as a server on a fresh data dir (the default SQLite store) with
# --memory-budget-bytes BUDGET, warms it with one small session, reads its idle
# RSS, then has twelve /v2/rpc connections each prompt their own session with
# `!emit CHUNKS BYTES` at once; the clients never open the stream, so every
# update stays in the session logs, the connections' rings and the store's
# queue as far as the budget lets it. RSS is sampled every 10 ms until every
# prompt is answered and the store has written everything; then it checks
# that every event is stored (storeDroppedEvents 0, every session's events
# page back without a gap).
#
# With READ=1 in the environment each client reads its connection's SSE
# stream instead (the rings drain; the logs and the queue hold).
#
# usage: scripts/chatty-rss.py BINARY [BUDGET] [CHUNKS] [BYTES]
#        (defaults 67108864, 4000, 8000: 32 MB per session, 384 MB in all)
import http.client, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time

binary = sys.argv[1]
budget = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
chunks = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
size = int(sys.argv[4]) if len(sys.argv) > 4 else 8000
SESSIONS = 12

data = tempfile.mkdtemp(prefix="chatty-rss-")
server = subprocess.Popen(
    [binary, "server", "--no-token", "--port", "0", "--data-dir", data,
     "--memory-budget-bytes", str(budget)],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
port = int(re.search(r":(\d+)\s*$", server.stdout.readline()).group(1))


def rss():
    with open(f"/proc/{server.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Client:
    def __init__(self):
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.conn = None

    def post(self, body):
        headers = {"content-type": "application/json"}
        if self.conn:
            headers["x-acp-connection-id"] = self.conn
        self.http.request("POST", "/v2/rpc", json.dumps(body), headers)
        response = self.http.getresponse()
        data = response.read()
        if self.conn is None:
            self.conn = response.getheader("x-acp-connection-id")
        return json.loads(data) if data else None

    def get(self, path):
        self.http.request("GET", path)
        return json.loads(self.http.getresponse().read())

    def session(self):
        self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": 1, "_meta": {"sandboxagent.dev": {"agent": "mock"}}}})
        answer = self.post({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {
            "cwd": "/tmp", "mcpServers": [], "_meta": {"sandboxagent.dev": {"agent": "mock"}}}})
        return answer["result"]["sessionId"]

    def emit(self, session, chunks, size):
        answer = self.post({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {
            "sessionId": session, "prompt": [{"type": "text", "text": f"!emit {chunks} {size}"}]}})
        assert answer["result"]["stopReason"] == "end_turn", answer


def health():
    return Client().get("/v2/health")


# Warm-up: the agent process, allocator arenas, the writer's connection.
warm = Client()
warm.emit(warm.session(), 10, 1000)
time.sleep(2)
idle = rss()

clients = [Client() for _ in range(SESSIONS)]
sessions = [c.session() for c in clients]
peak = [rss(), 0]
done = threading.Event()


def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.01)


def watch():
    while not done.is_set():
        try:
            peak[1] = max(peak[1], health()["memoryUsedBytes"])
        except Exception:
            pass
        time.sleep(0.1)


def read_stream(conn):
    stream = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    stream.request("GET", "/v2/rpc", headers={
        "accept": "text/event-stream", "x-acp-connection-id": conn})
    response = stream.getresponse()
    while not done.is_set() and response.read1(1 << 16):
        pass


if os.environ.get("READ") == "1":
    for c in clients:
        threading.Thread(target=read_stream, args=(c.conn,), daemon=True).start()
sampler = threading.Thread(target=sample)
watcher = threading.Thread(target=watch)
sampler.start()
watcher.start()
started = time.time()
emitters = [threading.Thread(target=c.emit, args=(s, chunks, size)) for c, s in zip(clients, sessions)]
for t in emitters:
    t.start()
for t in emitters:
    t.join()
answered = time.time() - started
while health()["storeWaiting"] != 0:
    time.sleep(0.05)
written = time.time() - started
done.set()
sampler.join()
watcher.join()
final = health()
# Every event of every session pages back without a gap, from the store
# (what memory evicted) and memory, following nextOffset.
whole = 0
check = Client()
for s in sessions:
    offset, gaps = 0, 0
    while True:
        page = check.get(f"/v2/sessions/{s}/events?offset={offset}&limit=1000")
        if not page["events"]:
            break
        for event in page["events"]:
            gaps += event["offset"] != offset
            offset = event["offset"] + 1
    whole += gaps == 0 and offset > chunks

mib = lambda n: n / 1048576
print(f"budget {mib(budget):.0f} MiB, {SESSIONS} sessions x !emit {chunks} {size}; "
      f"idle RSS {mib(idle):.1f} MiB, peak {mib(peak[0]):.1f} MiB, "
      f"peak - idle {mib(peak[0] - idle):.1f} MiB (bound: budget + 16 MiB = {mib(budget) + 16:.0f}); "
      f"memoryUsedBytes max {mib(peak[1]):.1f} MiB; answered in {answered:.1f} s, "
      f"stored in {written:.1f} s; storeDroppedEvents {final['storeDroppedEvents']}, "
      f"storePauses {final['storePauses']}, sessions read back whole {whole}/{SESSIONS}")
server.send_signal(signal.SIGTERM)
server.wait()
shutil.rmtree(data, ignore_errors=True)
