#!/usr/bin/env python3
"""A load driver for Osprey's OpenAI-compatible API, standard library only.

Threads, each with its own seeded random source, send a weighted mix of requests:

  chat          a non-streamed chat completion
  stream        a streamed one, read to `data: [DONE]`
  cancel        a streamed one whose socket is closed after the first content chunk
  rag           a chat answered from --collection (`"osprey": {"rag": ...}`); left out of the
                mix, with a note, when no collection is given
  tools         a chat with a `tools` list and `tool_choice: auto`
  conversation  one conversation per thread, then turns appended to it, alternately through
                `POST /v1/conversations/{id}/items` and through a chat naming it; every write the
                server acknowledged (2xx) is kept in the output's `acknowledged`, for --verify

Prompts are drawn from 30 questions and half the requests say `"osprey": {"cache": false}`, so
the response cache answers some but not all. With --rate the threads share one schedule of
R starts a second (never more in flight than --concurrency); without it each thread sends its
next request as soon as the last one ends. --urls spreads requests round-robin over replicas,
and a request that cannot connect (or is dropped before any answer) goes to the next one.

Each request's outcome is one of: ok; shed (a 503 whose code is one of SHED_CODES, designed
load shedding); http_error (any other non-2xx); stream_error (an error event inside a 200
stream); incomplete (a stream or body that ended or broke early); transport (no HTTP answer
from any replica); client_error (a bug of this script, kept apart so it shows). The JSON written to --out has the totals, counts per kind and outcome, a
status histogram (`status`), `errors_5xx` (5xx other than shedding), `non_envelope_errors`
(errors not in OpenAI's `{"error": {"message", "type"}}` envelope), latency percentiles per
kind, a per-second `timeline` of request starts (`t` seconds after `started_at`), samples of
failures, and `acknowledged` writes.

  python3 reliability/load.py --url http://127.0.0.1:8080 --concurrency 4 --duration 60 \\
      --mix chat=5,stream=3,cancel=1,rag=1,tools=1,conversation=1 --collection docs --out run.json
  python3 reliability/load.py --verify run.json --url http://127.0.0.1:8080   # "lost N of M"
"""

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

# 503 codes that mean designed shedding under load (crates/osprey-limits/src/admission.rs,
# osprey-router degrade/; the engine's full queue in crates/osprey-engine/src/engine.rs): not failures of
# the server. Every other 5xx counts in errors_5xx (store_unavailable, upstream_* included).
SHED_CODES = {"server_overloaded", "degraded_batch_deferred"}

KINDS = ("chat", "stream", "cancel", "rag", "tools", "conversation")
TIMEOUT = 120.0  # seconds a request may take, per socket operation

PROMPTS = [
    "What is the capital of France?", "Name three primary colors.", "Why is the sky blue?",
    "How many legs does a spider have?", "What is photosynthesis?", "Give me a synonym for happy.",
    "What does a compiler do?", "Who wrote Romeo and Juliet?", "What is the boiling point of water?",
    "Explain gravity in one sentence.", "What is an API key?", "How do I rotate a key?",
    "What is the largest planet?", "Translate 'good morning' into Spanish.", "What is 12 times 12?",
    "Name a famous painter.", "What do bees make?", "How does a rainbow form?",
    "What is the speed of light?", "Suggest a name for a cat.", "What is a prime number?",
    "Describe an osprey.", "What is the tallest mountain?", "How do vaccines work?",
    "What is machine learning?", "Give me a tip for better sleep.", "What language is spoken in Brazil?",
    "What is the freezing point of water in Fahrenheit?", "Why do leaves change color?",
    "What is a haiku?",
]
TOOL_PROMPTS = ["What is the weather in Paris?", "What time is it in Tokyo?",
                "Is it raining in London right now?", "Tell me the weather in Lisbon."]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]


def is_envelope(body):
    """Whether `body` (parsed JSON) is OpenAI's error envelope."""
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and isinstance(e.get("message"), str) and isinstance(e.get("type"), str)


class Transport(Exception):
    """No replica answered."""


class Replicas:
    """Base URLs taken round-robin; a request that cannot connect moves on to the next."""

    def __init__(self, urls, key=None, user=None):
        self.targets = [urllib.parse.urlsplit(u.rstrip("/")) for u in urls]
        self.headers = {"content-type": "application/json"}
        if key:
            self.headers["authorization"] = f"Bearer {key}"
        if user:
            self.headers["x-osprey-user"] = user
        self.next = 0
        self.lock = threading.Lock()

    def open(self, method, path, body=None):
        """(connection, response, failovers): the response's headers read, its body not."""
        with self.lock:
            first, self.next = self.next, self.next + 1
        data = None if body is None else json.dumps(body).encode()
        error = None
        for i in range(len(self.targets)):
            u = self.targets[(first + i) % len(self.targets)]
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=TIMEOUT)
            try:
                conn.request(method, u.path + path, body=data, headers=self.headers)
                return conn, conn.getresponse(), i
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                error = e
        raise Transport(f"{type(error).__name__}: {error}")

    def json(self, method, path, body=None):
        """(status, parsed body or None) of a plain request."""
        conn, resp, _ = self.open(method, path, body)
        try:
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, None


def read_error(resp, rec):
    """Fills `rec` from a non-2xx response."""
    raw = resp.read(65536)
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    rec["envelope"] = is_envelope(body)
    rec["code"] = body["error"].get("code") if rec["envelope"] else None
    rec["body"] = raw[:300].decode("utf-8", "replace")
    shed = resp.status == 503 and rec["code"] in SHED_CODES
    rec["outcome"] = "shed" if shed else "http_error"


def read_stream(conn, resp, rec, cancel):
    """Reads an SSE body: to [DONE], or (cancel) until the first content chunk."""
    while True:
        line = resp.readline()
        if not line:
            rec["outcome"] = "incomplete"
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            rec["outcome"] = "ok"
            return
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict) and "error" in event:
            rec.update(outcome="stream_error", stream_error=True, envelope=is_envelope(event),
                       code=(event["error"] or {}).get("code") if is_envelope(event) else None,
                       body=data[:300].decode("utf-8", "replace"))
            return
        delta = ((event.get("choices") or [{}])[0] or {}).get("delta") or {}
        if (delta.get("content") or delta.get("tool_calls")) and "ttft" not in rec:
            rec["ttft"] = time.time() - rec["start"]
            if cancel:
                conn.sock and conn.sock.shutdown(socket.SHUT_RDWR)
                rec["outcome"] = "ok"
                return


class Worker(threading.Thread):
    """One client thread: picks kinds by weight and records every request."""

    def __init__(self, run, index):
        super().__init__(daemon=True)
        self.load, self.index = run, index
        self.rng = random.Random(run.args.seed * 1000 + index)
        self.conversation = None
        self.turns = 0

    def run(self):
        run = self.load
        while run.pacer():
            kind = self.rng.choices(run.kinds, run.weights)[0]
            try:
                rec = self.one(kind)
            except Exception as e:  # a bug of this script must not stop the thread
                rec = {"kind": kind, "start": time.time(), "status": None, "failovers": 0,
                       "outcome": "client_error", "error": f"{type(e).__name__}: {e}", "latency": 0.0}
            run.record(rec)

    def chat_body(self, prompt, stream=False, **extra):
        a = self.load.args
        body = {"model": a.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": a.max_tokens, "temperature": 0, "stream": stream, **extra}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.rng.random() < 0.5:
            body.setdefault("osprey", {})["cache"] = False
        return body

    def one(self, kind):
        a, rng = self.load.args, self.rng
        rec = {"kind": kind, "start": time.time(), "status": None, "failovers": 0}
        prompt, stream, cancel, ack = rng.choice(PROMPTS), False, False, None
        method, path = "POST", "/v1/chat/completions"
        if kind == "chat":
            body = self.chat_body(prompt)
        elif kind in ("stream", "cancel"):
            body, stream, cancel = self.chat_body(prompt, stream=True), True, kind == "cancel"
        elif kind == "rag":
            body = self.chat_body(prompt, osprey={"rag": {"collection": a.collection, "top_k": 3}})
        elif kind == "tools":
            body = self.chat_body(rng.choice(TOOL_PROMPTS), tools=TOOLS, tool_choice="auto")
        else:
            method, path, body, ack = self.conversation_turn()
        rec["op"] = ack["op"] if ack else None
        try:
            conn, resp, rec["failovers"] = self.load.replicas.open(method, path, body)
        except Transport as e:
            rec.update(outcome="transport", error=str(e), latency=time.time() - rec["start"])
            return rec
        rec["status"] = resp.status
        try:
            if resp.status >= 300:
                read_error(resp, rec)
            elif stream:
                read_stream(conn, resp, rec, cancel)
            else:
                raw = resp.read()
                rec["outcome"] = "ok"
                if ack:
                    self.acknowledge(ack, json.loads(raw))
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as e:
            rec.update(outcome="incomplete", error=f"{type(e).__name__}: {e}")
        finally:
            conn.close()
        rec["latency"] = time.time() - rec["start"]
        return rec

    def conversation_turn(self):
        """The next conversation request: create, append an item, or chat in it."""
        tag = f"[{self.load.run_id} w{self.index} #{self.turns}]"
        self.turns += 1
        if self.conversation is None:
            content = f"Hello, this is a load test conversation. {tag}"
            body = {"metadata": {"load": self.load.run_id},
                    "items": [{"type": "message", "role": "user", "content": content}]}
            return "POST", "/v1/conversations", body, {"op": "create", "content": content}
        content = f"{self.rng.choice(PROMPTS)} {tag}"
        if self.turns % 2:
            body = {"items": [{"type": "message", "role": "user", "content": content}]}
            return ("POST", f"/v1/conversations/{self.conversation}/items", body,
                    {"op": "append", "conversation": self.conversation, "content": content})
        body = self.chat_body(content, osprey={"conversation": self.conversation,
                                               "history_tokens": 256, "summary_tokens": 64})
        return "POST", "/v1/chat/completions", body, {"op": "chat", "conversation": self.conversation,
                                                      "content": content}

    def acknowledge(self, ack, body):
        """Keeps a write the server acknowledged, with what identifies it."""
        if ack["op"] == "create":
            self.conversation = ack["conversation"] = body["id"]
        elif ack["op"] == "append":
            ack["item"] = body["data"][0]["id"]
        ack["t"] = round(time.time() - self.load.t0, 3)
        self.load.acknowledge(ack)


class Run:
    """The shared state of one load run: schedule, records, acknowledged writes."""

    def __init__(self, args):
        self.args = args
        self.run_id = f"{random.Random().getrandbits(32):08x}"
        self.user = args.user or f"load-{self.run_id}"
        urls = args.urls.split(",") if args.urls else [args.url]
        self.replicas = Replicas(urls, args.key, self.user)
        mix = dict((k, float(w)) for k, w in (p.split("=") for p in args.mix.split(",") if p))
        self.notes = []
        unknown = set(mix) - set(KINDS)
        if unknown:
            raise SystemExit(f"unknown kinds in --mix: {', '.join(sorted(unknown))}")
        if mix.get("rag") and not args.collection:
            mix.pop("rag")
            self.notes.append("rag left out of the mix: no --collection")
        self.kinds = [k for k in mix if mix[k] > 0]
        self.weights = [mix[k] for k in self.kinds]
        self.records, self.acked = [], []
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.deadline = self.t0 + args.duration
        self.next_start = self.t0

    def pacer(self):
        """Waits for this thread's next start; False once the run's time is up. Starts missed
        while every thread was busy are not made up in a burst afterwards."""
        if self.args.rate:
            with self.lock:
                at = self.next_start = max(self.next_start, time.time())
                self.next_start += 1.0 / self.args.rate
            time.sleep(max(0.0, at - time.time()))
        return time.time() < self.deadline

    def record(self, rec):
        with self.lock:
            self.records.append(rec)

    def acknowledge(self, ack):
        with self.lock:
            self.acked.append(ack)

    def go(self):
        workers = [Worker(self, i) for i in range(self.args.concurrency)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return summarize(self)


def percentiles(values):
    if not values:
        return None
    v = sorted(values)
    pick = lambda q: round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 1)
    return {"n": len(v), "p50_ms": pick(0.50), "p95_ms": pick(0.95), "p99_ms": pick(0.99),
            "max_ms": round(v[-1] * 1000, 1)}


def summarize(run):
    """The output document of a run."""
    recs = sorted(run.records, key=lambda r: r["start"])
    count = lambda pred: sum(1 for r in recs if pred(r))
    ok = count(lambda r: r["outcome"] == "ok")
    wall = max([r["start"] + r.get("latency", 0) for r in recs], default=run.t0) - run.t0
    per_kind, outcomes, status = {}, {}, {}
    for r in recs:
        k = per_kind.setdefault(r["kind"], {"requests": 0})
        k["requests"] += 1
        k[r["outcome"]] = k.get(r["outcome"], 0) + 1
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        s = str(r["status"]) if r["status"] is not None else "transport"
        status[s] = status.get(s, 0) + 1
    for kind, k in per_kind.items():
        mine = [r for r in recs if r["kind"] == kind and r["outcome"] == "ok"]
        k["latency"] = percentiles([r["latency"] for r in mine])
        if kind == "stream":
            k["ttft"] = percentiles([r["ttft"] for r in mine if "ttft" in r])
        if kind == "conversation":
            k["ops"] = {op: percentiles([r["latency"] for r in mine if r["op"] == op])
                        for op in sorted({r["op"] for r in mine})}
    timeline = [{"t": t, "ok": 0, "failed": 0, "shed": 0}
                for t in range(int(max([r["start"] - run.t0 for r in recs], default=0)) + 1)]
    for r in recs:
        slot = timeline[int(r["start"] - run.t0)]
        slot["ok" if r["outcome"] == "ok" else "failed"] += 1
        slot["shed"] += r["outcome"] == "shed"
    failures = [{"t": round(r["start"] - run.t0, 3), **{k: r.get(k) for k in (
        "kind", "op", "status", "outcome", "code", "envelope", "error", "body")}}
        for r in recs if r["outcome"] != "ok"]
    return {
        "started_at": run.t0, "duration_s": round(wall, 2), "run_id": run.run_id, "user": run.user,
        "config": {k: v for k, v in vars(run.args).items() if k != "key"},
        "notes": run.notes,
        "requests": len(recs), "ok": ok, "failed": len(recs) - ok,
        "throughput_ok_per_s": round(ok / wall, 3) if wall > 0 else 0.0,
        "per_kind": per_kind, "outcomes": outcomes, "status": status,
        "errors_5xx": count(lambda r: (r["status"] or 0) >= 500 and r["outcome"] != "shed"),
        "shed": outcomes.get("shed", 0),
        "rate_limited": count(lambda r: r["status"] == 429),
        "non_envelope_errors": count(lambda r: r["outcome"] in ("http_error", "shed", "stream_error")
                                     and not r.get("envelope")),
        "stream_errors": outcomes.get("stream_error", 0),
        "incomplete_streams": outcomes.get("incomplete", 0),
        "transport_errors": outcomes.get("transport", 0),
        "failovers": sum(r["failovers"] for r in recs),
        "latency": percentiles([r["latency"] for r in recs if r["outcome"] == "ok"]),
        "timeline": timeline,
        "failure_samples": failures[:50],
        "acknowledged": sorted(run.acked, key=lambda a: a["t"]),
        **({"records": [{**r, "start": round(r["start"] - run.t0, 3)} for r in recs]}
           if run.args.records else {}),
    }


def item_text(item):
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def verify(path, urls, key=None, user=None):
    """(lost, total, details) of the acknowledged writes in the run written to `path`."""
    with open(path) as f:
        doc = json.load(f)
    acked = doc.get("acknowledged", [])
    replicas = Replicas(urls, key, user or doc.get("user"))
    texts = {}  # conversation -> set of item texts, or None when unreadable
    for conv in {a["conversation"] for a in acked}:
        seen, after = set(), None
        while True:
            q = f"?order=asc&limit=100" + (f"&after={after}" if after else "")
            status, body = replicas.json("GET", f"/v1/conversations/{conv}/items{q}")
            if status != 200:
                seen = None
                break
            seen.update(item_text(i) for i in body["data"])
            if not body.get("has_more") or not body["data"]:
                break
            after = body["data"][-1]["id"]
        texts[conv] = seen
    lost = []
    for a in acked:
        seen = texts.get(a["conversation"])
        if seen is None or a["content"] not in seen:
            lost.append(a)
        elif a["op"] == "append":
            status, body = replicas.json("GET", f"/v1/conversations/{a['conversation']}/items/{a['item']}")
            if status != 200 or item_text(body) != a["content"]:
                lost.append(a)
    return len(lost), len(acked), lost


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--urls", help="comma-separated base URLs, round-robin with failover")
    p.add_argument("--key")
    p.add_argument("--user", help="x-osprey-user (default load-RUNID; --verify: the run's)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--rate", type=float, help="request starts per second, shared by all threads")
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--mix", default="chat=5,stream=3,cancel=1,rag=1,tools=1,conversation=1")
    p.add_argument("--collection")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="where the JSON goes (default: stdout)")
    p.add_argument("--records", action="store_true", help="also write every request's record")
    p.add_argument("--verify", metavar="FILE", help="check the acknowledged writes of FILE")
    args = p.parse_args(argv)
    if args.verify:
        urls = args.urls.split(",") if args.urls else [args.url]
        lost, total, missing = verify(args.verify, urls, args.key, args.user)
        for a in missing[:20]:
            print("missing:", json.dumps(a), file=sys.stderr)
        print(f"lost {lost} of {total}")
        return 1 if lost else 0
    doc = Run(args).go()
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    k = doc
    print(f"requests {k['requests']} ok {k['ok']} failed {k['failed']} 5xx {k['errors_5xx']} shed {k['shed']} "
          f"non-envelope {k['non_envelope_errors']} transport {k['transport_errors']} "
          f"ok/s {k['throughput_ok_per_s']} acknowledged {len(k['acknowledged'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
