#!/usr/bin/env python3
"""Fault injection against live Osprey processes, scripted and repeatable.

Each scenario starts what it needs (a server, workers, replicas, a private Redis or Postgres, a
misbehaving upstream), drives load through reliability/load.py, injects one fault and checks
what must hold: no acknowledged write lost, the server keeps serving other requests, every
error is a clean OpenAI envelope, no 5xx outside designed shedding, resources (KV blocks, file
descriptors) back to baseline. A scenario's figures go to stdout as one line and, for all of
them, to --out as JSON (the table in docs/reliability.md is made from it).

usage: reliability/chaos.py [--out FILE] [--quick] [SCENARIO ...]   (default: all)
The binary is $OSPREY_BIN (default ~/.cache/osprey-release/release/osprey).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("OSPREY_BIN", os.path.expanduser("~/.cache/osprey-release/release/osprey"))
MODEL = "smollm2-135m-instruct"
ADMIN = "chaos-admin-key"
WORK = tempfile.mkdtemp(prefix="osprey-chaos-")
QUICK = False  # --quick: shorter load phases


def seconds(full):
    return max(6, full // 3) if QUICK else full


# ---------------------------------------------------------------- processes and HTTP


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own process group, its output in WORK/NAME.log."""

    def __init__(self, name, argv, env=None, user=None):
        self.name, self.log = name, os.path.join(WORK, name + ".log")
        if user:
            argv = ["runuser", "-u", user, "--"] + argv
        with open(self.log, "ab") as out:
            self.p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                      start_new_session=True)

    @property
    def pid(self):
        return self.p.pid

    def kill(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


def http(method, url, body=None, key=None, timeout=60):
    """(status, parsed JSON or text) of one request; status 0 for a transport error."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key:
        req.add_header("authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except (OSError, urllib.error.URLError) as e:
        return 0, str(e)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def is_envelope(body):
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and isinstance(e.get("message"), str) and isinstance(e.get("type"), str)


def wait_ready(url, proc=None, timeout=180):
    start = time.time()
    while time.time() - start < timeout:
        if proc and proc.p.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {proc.output()[-2000:]}")
        if http("GET", url + "/ready", timeout=2)[0] == 200:
            return time.time() - start
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def serve(name, *args, env=None):
    """`osprey serve` on a free port with its own SQLite store (unless args name one)."""
    port = free_port()
    argv = [BIN, "serve", "--port", str(port), "--admin-key", ADMIN]
    if "--store" not in args:
        argv += ["--store", f"sqlite://{WORK}/{name}.db"]
    proc = Proc(name, argv + list(args), env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def metrics(url):
    """Prometheus samples summed over their labels: name -> value."""
    status, text = http("GET", url + "/metrics", timeout=10)
    out = {}
    for line in (text if status == 200 and isinstance(text, str) else "").splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = name.split("{")[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def warmed_fds(proc, url, concurrency, mix="chat=3,stream=2"):
    """The descriptors `proc` holds once it has served a moment of load like the scenario's:
    what it opens on first use and keeps (the store's pooled connections, the request log's
    writer) is part of its baseline, not a leak."""
    Load([url], 3, concurrency=concurrency, mix=mix).result()
    time.sleep(1)
    return fds(proc.pid)


def chat(url, content="Say hi.", max_tokens=8, model=MODEL, timeout=60):
    return http("POST", url + "/v1/chat/completions", {"model": model, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": content}], "osprey": {"cache": False}}, timeout=timeout)


class Load:
    """reliability/load.py in the background; `result()` waits for its JSON."""

    def __init__(self, urls, duration, concurrency=2, mix="chat=3,stream=2", extra=()):
        self.out = os.path.join(WORK, f"load-{time.time_ns()}.json")
        self.started = time.time()
        argv = [sys.executable, os.path.join(HERE, "load.py"), "--url", urls[0], "--duration", str(duration),
                "--concurrency", str(concurrency), "--mix", mix, "--max-tokens", "12", "--out", self.out, *extra]
        if len(urls) > 1:
            argv += ["--urls", ",".join(urls)]
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(self.out + ".log", "w"))

    def at(self, t):
        """Sleeps until `t` seconds into the load; returns the offset reached."""
        time.sleep(max(0.0, self.started + t - time.time()))
        return time.time() - self.started

    def result(self):
        self.p.wait()
        with open(self.out) as f:
            return json.load(f)


def failures_after(load, fault_at):
    """Seconds from the fault to the end of the last second with a failure (0: none)."""
    last = None
    for s in load.get("timeline", []):
        if s["t"] >= int(fault_at) and s.get("failed", 0):
            last = s["t"]
    return 0.0 if last is None else round(last + 1 - fault_at, 1)


def summary(load):
    """The figures every scenario reports from its load."""
    return {
        "requests": load.get("requests", 0),
        "failed": load.get("failed", 0),
        "errors_5xx": undesigned_5xx(load),
        "refused_503": load.get("status", {}).get("503", 0),
        "shed": load.get("shed", 0),
        "non_envelope": load.get("non_envelope_errors", 0),
        "transport_errors": load.get("transport_errors", 0),
    }


def undesigned_5xx(load):
    """5xx answers other than the designed 503 refusals (store unavailable, shedding)."""
    return sum(n for status, n in load.get("status", {}).items() if status.isdigit() and int(status) >= 500
               and status != "503")


class Checks:
    """What must hold in one scenario, and whether it did."""

    def __init__(self):
        self.items = []

    def __call__(self, ok, what, detail=""):
        self.items.append({"holds": bool(ok), "what": what, "detail": str(detail)})

    def holds(self):
        return all(c["holds"] for c in self.items)


# ---------------------------------------------------------------- scenarios


def panic_in_handler(c):
    """A request that panics inside its handler costs only itself (a clean 500 envelope)."""
    proc, url = serve("panic", "--fault-injection")
    load = Load([url], seconds(30))
    answers = []
    for _ in range(20):
        load.at(len(answers) + 3)
        answers.append(http("POST", url + "/admin/faults/panic", {}, key=ADMIN))
    result = load.result()
    clean = sum(1 for s, b in answers if s == 500 and is_envelope(b))
    c(clean == len(answers), "every panic answers 500 in the OpenAI envelope", f"{clean}/{len(answers)}")
    c(result["failed"] == 0, "the load beside it loses nothing", summary(result))
    c(chat(url)[0] == 200, "the server serves after the panics")
    c(proc.p.poll() is None, "the process is alive")
    proc.kill()
    return {**summary(result), "faults": len(answers), "recovery_s": 0.0}


def worker_kill(c):
    """kill -9 of one of two workers under load: the gateway routes around it."""
    ports = [free_port(), free_port()]
    workers = [Proc(f"worker{i}", [BIN, "worker", "--port", str(p)]) for i, p in enumerate(ports)]
    for w, p in zip(workers, ports):
        wait_ready(f"http://127.0.0.1:{p}", w)
    gateway, url = serve("fleet-gateway", "--worker", ",".join(f"http://127.0.0.1:{p}" for p in ports))
    load = Load([url], seconds(40), concurrency=4)
    fault = load.at(seconds(40) // 4)
    workers[0].kill()
    result = load.result()
    recovery = failures_after(result, fault)
    c(result["errors_5xx"] <= 4, "at most the requests in flight on the killed worker fail (4 clients)", summary(result))
    c(result["non_envelope_errors"] == 0, "every failure is a clean envelope or in-stream error event")
    c(chat(url)[0] == 200, "the gateway serves from the surviving worker")
    for p in [gateway] + workers:
        p.kill()
    return {**summary(result), "recovery_s": recovery}


def gateway_kill(c):
    """kill -9 of one of two gateway replicas sharing Postgres and Redis: clients fail over,
    and every conversation write either replica acknowledged is kept."""
    db = f"osprey_chaos_{os.getpid()}"
    pg = os.environ.get("OSPREY_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    base, _ = pg.rsplit("/", 1)
    subprocess.run(["psql", pg, "-qc", f"CREATE DATABASE {db}"], check=True)
    redis = os.environ.get("OSPREY_TEST_REDIS_URL", "redis://127.0.0.1:6379")
    shared = ["--store", f"{base}/{db}", "--redis", redis, "--replicas", "2"]
    a, url_a = serve("replica-a", *shared)
    b, url_b = serve("replica-b", *shared)
    load = Load([url_a, url_b], seconds(40), concurrency=4, mix="chat=2,stream=1,conversation=3")
    fault = load.at(seconds(40) // 4)
    a.kill()
    result = load.result()
    lost = verify(result, url_b)
    c(lost == 0, "no acknowledged write is lost", f"lost {lost} of {len(result.get('acknowledged', []))}")
    c(result["errors_5xx"] == 0, "no 5xx: the killed replica's in-flight requests are transport errors, retried elsewhere",
      summary(result))
    c(chat(url_b)[0] == 200, "the surviving replica serves")
    b.kill()
    subprocess.run(["psql", pg, "-qc", f"DROP DATABASE {db}"])
    return {**summary(result), "acknowledged": len(result.get("acknowledged", [])), "lost": lost,
            "recovery_s": failures_after(result, fault)}


def verify(result, url):
    """Acknowledged writes of a load run missing from `url`."""
    path = os.path.join(WORK, f"verify-{time.time_ns()}.json")
    with open(path, "w") as f:
        json.dump(result, f)
    out = subprocess.run([sys.executable, os.path.join(HERE, "load.py"), "--verify", path, "--url", url],
                         capture_output=True, text=True)
    for line in out.stderr.splitlines()[:5]:
        print("    " + line, flush=True)
    for line in out.stdout.splitlines():
        if line.startswith("lost "):
            return int(line.split()[1])
    raise RuntimeError(f"load.py --verify said: {out.stdout} {out.stderr}")


def redis_outage(c):
    """Redis (rate limits, revocations) down for a while and back: requests go on, limits fall
    back to this replica's share, and sharing resumes."""
    port = free_port()
    start_redis = lambda: Proc("redis", ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"])
    redis = start_redis()
    time.sleep(0.5)
    proc, url = serve("redis-outage", "--redis", f"redis://127.0.0.1:{port}")
    load = Load([url], seconds(45), concurrency=2)
    fault = load.at(seconds(45) // 4)
    redis.kill()
    load.at(seconds(45) // 2)
    down = metrics(url).get("osprey_ratelimit_redis_up", -1)
    redis = start_redis()
    back_at = time.time()
    recovery = None
    while time.time() - back_at < 30:
        if metrics(url).get("osprey_ratelimit_redis_up") == 1:
            recovery = round(time.time() - back_at, 1)
            break
        time.sleep(0.5)
    result = load.result()
    c(result["failed"] == 0, "no request fails while Redis is down", summary(result))
    c(down == 0, "the outage is visible (osprey_ratelimit_redis_up 0)", down)
    c(recovery is not None, "limits are shared again after Redis returns", f"{recovery} s")
    proc.kill()
    redis.kill()
    return {**summary(result), "recovery_s": recovery, "fault_at_s": round(fault, 1)}


def postgres_outage(c):
    """The store's Postgres crashes (immediate stop) under conversation writes and comes back:
    writes meanwhile are refused with a clean 503, none acknowledged is lost, no restart."""
    pg_bin = next(os.path.join("/usr/lib/postgresql", v, "bin") for v in sorted(os.listdir("/usr/lib/postgresql")))
    data, port = os.path.join(WORK, "pg"), free_port()
    os.makedirs(data)
    shutil.chown(WORK, "postgres")
    shutil.chown(data, "postgres")
    run = lambda tool, *a: subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(pg_bin, tool), *a],
                                          check=True, stdout=subprocess.DEVNULL)
    run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
    opts = f"-p {port} -k {WORK} -c listen_addresses=127.0.0.1"
    ctl = lambda *a: run("pg_ctl", "-D", data, "-o", opts, "-l", os.path.join(data, "log"), *a)
    ctl("start", "-w")
    proc, url = serve("postgres-outage", "--store", f"postgres://postgres@127.0.0.1:{port}/postgres")
    load = Load([url], seconds(45), concurrency=3, mix="conversation=3,chat=1")
    fault = load.at(seconds(45) // 4)
    ctl("stop", "-m", "immediate")
    time.sleep(6)
    ctl("start", "-w")
    back = time.time() - load.started
    result = load.result()
    lost = verify(result, url)
    c(lost == 0, "no acknowledged write is lost", f"lost {lost} of {len(result.get('acknowledged', []))}")
    c(result["non_envelope_errors"] == 0, "refusals are clean envelopes", summary(result))
    c(undesigned_5xx(result) == 0, "refusals while down are designed (503 store_unavailable), not 500s",
      result.get("status"))
    c(proc.p.poll() is None and chat(url)[0] == 200, "the server recovered without a restart")
    proc.kill()
    ctl("stop", "-m", "fast")
    return {**summary(result), "acknowledged": len(result.get("acknowledged", [])), "lost": lost,
            "recovery_s": failures_after(result, back)}


def disk_full(c):
    """The store's disk and the KV cold tier's fill up: generation goes on, writes are refused
    cleanly, and everything works again once space returns."""
    mnt = os.path.join(WORK, "small-disk")
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt], check=True)
    try:
        proc, url = serve("disk-full", "--store", f"sqlite://{mnt}/osprey.db", "--kv-cold-disk", "64MiB",
                          "--kv-cold-dir", os.path.join(mnt, "kv-cold"), "--kv-cache-memory", "16MiB")
        load = Load([url], seconds(45), concurrency=3, mix="chat=2,stream=1,conversation=2")
        fault = load.at(seconds(45) // 4)
        # Whatever else gives space back (the KV cold tier yields its segments), the filler
        # takes it again, so the disk stays full until it is removed.
        full = threading.Event()
        full.set()

        def fill():
            n = 0
            while full.is_set():
                n += 1
                subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/filler-{n}", "bs=64k"],
                               stderr=subprocess.DEVNULL)
                time.sleep(0.2)

        filler = threading.Thread(target=fill)
        filler.start()
        time.sleep(1)
        during = chat(url, "What is an osprey?")
        load.at(seconds(45) // 2)
        full.clear()
        filler.join()
        for f in os.listdir(mnt):
            if f.startswith("filler-"):
                os.remove(os.path.join(mnt, f))
        freed = time.time() - load.started
        result = load.result()
        lost = verify(result, url)
        c(during[0] == 200, "generation goes on with the disk full", during[0])
        c(result["non_envelope_errors"] == 0, "refused writes are clean envelopes", summary(result))
        c(undesigned_5xx(result) == 0, "no 500s: a full disk is a designed refusal (503 store_unavailable)",
          result.get("status"))
        c(lost == 0, "no acknowledged write is lost", f"lost {lost}")
        after = http("POST", url + "/v1/conversations", {})
        c(after[0] in (200, 201), "writes work again once space returns, without a restart", after[0])
        proc.kill()
        if os.environ.get("CHAOS_KEEP_STORE"):
            shutil.copytree(mnt, os.path.join(WORK, "store-copy"), dirs_exist_ok=True)
            with open(os.path.join(WORK, "disk-full-load.json"), "w") as f:
                json.dump(result, f)
        # Whether what was acknowledged is on disk at all: a fresh process on the same store.
        proc, url = serve("disk-full-restarted", "--store", f"sqlite://{mnt}/osprey.db")
        lost_after_restart = verify(result, url)
        c(lost_after_restart == 0, "after a restart every acknowledged write is there", f"lost {lost_after_restart}")
        proc.kill()
        return {**summary(result), "lost": lost, "lost_after_restart": lost_after_restart,
                "recovery_s": failures_after(result, freed)}
    finally:
        subprocess.run(["umount", "-l", mnt])


def corrupt_model(c):
    """A truncated, a mangled and an empty model file: the server stays up, says it is not
    ready and why (naming the file), answers requests with a clean 503, and never panics."""
    model = next(model_files())
    cases = {"truncated": lambda b: b[: len(b) // 2], "bad-magic": lambda b: b"XXXX" + b[4:],
             "header-cut": lambda b: b[:4096], "empty": lambda b: b""}
    with open(model, "rb") as f:
        original = f.read()
    results = {}
    for name, mangle in cases.items():
        path = os.path.join(WORK, f"{name}.gguf")
        with open(path, "wb") as f:
            f.write(mangle(original))
        port = free_port()
        proc = Proc(f"corrupt-{name}", [BIN, "serve", "--port", str(port), "--model", path, "--served-model-name", MODEL,
                                        "--store", f"sqlite://{WORK}/corrupt-{name}.db"])
        url, started, ready = f"http://127.0.0.1:{port}", time.time(), (0, None)
        while time.time() - started < 60:
            ready = http("GET", url + "/ready", timeout=2)
            if ready[0] not in (0, 200) and "fail" in json.dumps(ready[1]).lower():
                break
            time.sleep(0.3)
        answer = chat(url)
        log = proc.output()
        results[name] = {"ready": ready[0], "reason": json.dumps(ready[1])[:200], "chat": answer[0],
                         "seconds": round(time.time() - started, 2)}
        c(proc.p.poll() is None and ready[0] == 503 and answer[0] == 503 and is_envelope(answer[1]),
          f"{name}: up, not ready, requests get a clean 503", results[name])
        c(path in log and "panicked" not in log, f"{name}: the log names the file; no panic")
        proc.kill()
    del original
    return {"requests": len(cases) * 2, "failed": 0, "errors_5xx": 0, "cases": results}


def model_files():
    home = os.environ.get("OSPREY_HOME", os.path.expanduser("~/.cache/osprey"))
    for root, _, files in os.walk(os.path.join(home, "models")):
        for f in files:
            if f.endswith(".gguf"):
                yield os.path.join(root, f)


def slowloris(c):
    """Hundreds of connections trickling their headers a byte at a time: the server keeps
    serving everyone else and closes them; file descriptors return to baseline."""
    proc, url = serve("slowloris")
    port = int(url.rsplit(":", 1)[1])
    base_fds = warmed_fds(proc, url, 2)
    socks, stop = [], threading.Event()
    for _ in range(400):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)

    def trickle():
        while not stop.is_set():
            for s in list(socks):
                try:
                    s.sendall(b"X")
                except OSError:
                    socks.remove(s)
            stop.wait(2)

    t = threading.Thread(target=trickle)
    t.start()
    load = Load([url], seconds(30), concurrency=2)
    result = load.result()
    held = fds(proc.pid) - base_fds
    closed_by_server = 400 - len(socks)
    stop.set()
    t.join()
    for s in socks:
        s.close()
    time.sleep(2)
    after = fds(proc.pid) - base_fds
    c(result["failed"] == 0, "normal clients are served throughout", summary(result))
    c(after <= 2, "descriptors return to baseline once the slow clients go", f"{after} above baseline")
    proc.kill()
    return {**summary(result), "slow_connections": 400, "closed_by_server": closed_by_server,
            "fds_held_during": held, "fds_after": after}


def client_disconnects(c):
    """Clients that hang up mid-stream: their sequences stop and their KV blocks come back."""
    proc, url = serve("disconnects")
    base_fds = warmed_fds(proc, url, 6, mix="cancel=3,stream=1,chat=1")
    base_blocks = metrics(url).get("osprey_kv_blocks_used", 0)
    load = Load([url], seconds(30), concurrency=6, mix="cancel=3,stream=1,chat=1", extra=["--max-tokens", "64"])
    result = load.result()
    time.sleep(3)
    blocks = metrics(url).get("osprey_kv_blocks_used", -1)
    after_fds = fds(proc.pid) - base_fds
    c(blocks <= base_blocks, "KV blocks held return to baseline", f"{base_blocks} -> {blocks}")
    c(after_fds <= 2, "descriptors return to baseline", f"{after_fds} above")
    c(result["errors_5xx"] == 0 and result["non_envelope_errors"] == 0, "no 5xx, no bare errors", summary(result))
    cancelled = result.get("per_kind", {}).get("cancel", {})
    proc.kill()
    return {**summary(result), "cancelled": cancelled, "kv_blocks_before": base_blocks, "kv_blocks_after": blocks,
            "fds_after": after_fds}


def upstream_faults(c):
    """Upstream models that hang, answer garbage, 500, or cut a stream: each request to them
    ends within its timeout in a clean envelope; the local model serves on."""
    port = free_port()
    bad = Proc("bad-upstream", [sys.executable, os.path.join(HERE, "bad_upstream.py"), str(port)])
    time.sleep(1)
    config = os.path.join(WORK, "upstreams.toml")
    with open(config, "w") as f:
        for mode in ("hang", "garbage", "fail", "cut"):
            f.write(f'[models.{mode}]\nurl = "http://127.0.0.1:{port}/{mode}/v1"\ntimeout_secs = 3\nmax_retries = 1\n\n')
    proc, url = serve("upstream-faults", "--config", config)
    load = Load([url], seconds(40), concurrency=2)
    outcomes = {}
    for mode in ("hang", "garbage", "fail", "cut"):
        for stream in (False, True):
            started = time.time()
            body = {"model": mode, "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
            status, answer = http("POST", url + "/v1/chat/completions", body, timeout=30)
            took = round(time.time() - started, 2)
            clean = is_envelope(answer) or (stream and status == 200 and isinstance(answer, str) and '"error"' in answer)
            outcomes[f"{mode}{'-stream' if stream else ''}"] = {"status": status, "seconds": took, "clean": clean}
            c(clean and took < 12, f"{mode}{' (stream)' if stream else ''}: a clean error within the timeout",
              outcomes[f"{mode}{'-stream' if stream else ''}"])
    result = load.result()
    c(result["failed"] == 0, "the local model serves on", summary(result))
    proc.kill()
    bad.kill()
    return {**summary(result), "upstream_requests": len(outcomes), "outcomes": outcomes}


SCENARIOS = {f.__name__.replace("_", "-"): f for f in [
    panic_in_handler, worker_kill, gateway_kill, redis_outage, postgres_outage, disk_full, corrupt_model, slowloris,
    client_disconnects, upstream_faults]}


def main():
    global QUICK
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", choices=[[]] + list(SCENARIOS), metavar="SCENARIO")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results", "chaos.json"))
    parser.add_argument("--quick", action="store_true", help="short load phases (a smoke test)")
    args = parser.parse_args()
    QUICK = args.quick
    chosen = args.scenarios or list(SCENARIOS)
    report = []
    for name in chosen:
        checks, started = Checks(), time.time()
        try:
            figures = SCENARIOS[name](checks)
        except Exception as e:  # a scenario that could not run is a failure, with why
            checks(False, "the scenario ran", repr(e))
            figures = {}
        row = {"scenario": name, "what": SCENARIOS[name].__doc__.split("\n")[0].strip(), "seconds": round(time.time() - started),
               "holds": checks.holds(), "checks": checks.items, **figures}
        report.append(row)
        print(f"{name:20} {'HOLDS' if row['holds'] else 'FAILS':5}  {row['seconds']:4} s  "
              f"requests {figures.get('requests', 0)}  failed {figures.get('failed', 0)}  "
              f"5xx {figures.get('errors_5xx', 0)}  lost {figures.get('lost', 0)}  recovery {figures.get('recovery_s', '-')} s",
              flush=True)
        for ch in checks.items:
            if not ch["holds"]:
                print(f"    FAILED: {ch['what']}: {ch['detail']}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "binary": BIN, "scenarios": report}, f, indent=1)
    print(f"logs in {WORK}; figures in {args.out}")
    sys.exit(0 if all(r["holds"] for r in report) else 1)


if __name__ == "__main__":
    main()
