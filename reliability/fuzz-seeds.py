#!/usr/bin/env python3
"""Writes the starting inputs of the fuzz targets into fuzz/corpus/TARGET/seed-*.

Each seed is a small, valid example of what the target parses, so the fuzzers start from the
real formats rather than from nothing. Run once; the fuzzers then grow the corpus.
usage: reliability/fuzz-seeds.py [CHECKPOINT_DIR]   (an `osprey convert` output, for its config)
"""
import gzip, json, os, struct, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(ROOT, target, "seed-" + name), "wb") as f:
        f.write(data)


MODEL = "smollm2-135m-instruct"
chat = lambda **kw: json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **kw})
put("request_json", "chat", chat(max_tokens=8, temperature=0))
put("request_json", "chat-stream", chat(stream=True, stream_options={"include_usage": True}, n=2, logprobs=True, top_logprobs=2))
put("request_json", "chat-schema", chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "n": {"type": "integer", "minimum": 0}},
    "required": ["city"], "additionalProperties": False}}}))
put("request_json", "chat-json-object", chat(response_format={"type": "json_object"}))
put("request_json", "chat-tools", chat(tools=[{"type": "function", "function": {"name": "weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    tool_choice="required", parallel_tool_calls=False))
put("request_json", "chat-grammar", chat(osprey={"grammar": {"regex": "[a-z]{1,8}"}}))
put("request_json", "chat-lark", chat(osprey={"grammar": {"lark": "start: \"yes\" | \"no\""}}))
put("request_json", "chat-history", json.dumps({"model": MODEL, "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}))
put("request_json", "completion", json.dumps({"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "echo": True, "logprobs": 2}))
put("request_json", "completion-tokens", json.dumps({"model": MODEL, "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 1, "stop": ["\n"]}))

delta = lambda text: "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
    "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + "\n\n"
usage = "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}) + "\n\n"
put("upstream_sse", "stream", "\x07" + delta("Hel") + delta("lo") + usage + "data: [DONE]\n\n")
put("upstream_sse", "comments", "\x01: keep-alive\n\nevent: error\ndata: {\"error\": {\"message\": \"x\"}}\n\nretry: 10\n\n")

put("chat_template", "conversation", "system\x01Be brief.\0user\x01Hi\0assistant\x01Hello\0user\x01Bye")
put("chat_template", "odd-roles", "tool\x01{}\0\x01\0<|im_start|>\x01<|im_end|>")
put("tokenizer", "text", "The osprey dives for fish. Ünïcödé, 数字 123 <|im_start|> \t\n  ")

def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def gguf(kvs, tensors):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, kind, payload in kvs:
        out += gguf_string(key) + struct.pack("<I", kind) + payload
    offset = 0
    for name, dims, ggml_type, size in tensors:
        out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
        offset += size
    out += b"\0" * (-len(out) % 32)
    return out + b"\0" * offset

tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ"]
put("gguf_header", "tiny", gguf([
    ("general.architecture", 8, gguf_string("llama")),
    ("llama.block_count", 4, struct.pack("<I", 1)),
    ("llama.embedding_length", 4, struct.pack("<I", 8)),
    ("llama.attention.head_count", 4, struct.pack("<I", 2)),
    ("llama.feed_forward_length", 4, struct.pack("<I", 16)),
    ("llama.context_length", 4, struct.pack("<I", 64)),
    ("tokenizer.ggml.model", 8, gguf_string("gpt2")),
    ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(gguf_string(t) for t in tokens)),
    ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + gguf_string("a b")),
    ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
    ("tokenizer.chat_template", 8, gguf_string("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")),
], [("token_embd.weight", [8, 7], 0, 8 * 7 * 4)]))

def safetensors(tensors):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

def prefixed(b):
    return struct.pack("<H", len(b)) + b

config = b"{}"
if len(sys.argv) > 1:
    config = open(os.path.join(sys.argv[1], "config.json"), "rb").read()
shard = safetensors([("blk.0.attn_q.weight.blocks", "U8", [2, 16], bytes(range(32))),
                     ("blk.0.attn_q.weight.scales", "U8", [2, 1], b"\x7f\x80"),
                     ("output_norm.weight", "F32", [2], struct.pack("<2f", 1.0, 0.5)),
                     ("token_embd.weight", "U8", [2, 20], bytes(40))])
put("checkpoint_header", "mxfp4", prefixed(config) + prefixed(json.dumps({"token_embd.weight": "Q4_1"}).encode()) + shard)

put("ingest", "markdown", b"\x02# Title\n\nSome *text* with a [link](http://x).\n\n## Part\n\n- item\n")
put("ingest", "html", b"\x01<html><head><title>T</title><script>x()</script></head><body><p>Hello &amp; bye</p></body></html>")
put("ingest", "jsonl", b"\x04" + b'{"id": "a", "title": "A", "text": "alpha"}\n{"text": "beta", "metadata": {"k": 1}}\n')
put("ingest", "text-gz", b"\x05" + gzip.compress(b"# Zipped\n\nplain words\n"))
pdf = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "osprey-rag", "tests", "fixtures", "battery.pdf"), "rb").read()
if len(pdf) < 64 << 10:
    put("ingest", "pdf", b"\x00" + pdf)

put("config", "full", """port = 8080
max_num_seqs = 16
upstream = ["big=http://127.0.0.1:9/v1"]
[tenants.acme]
rpm = 60
tpm = 100000
models = ["smollm2-135m-instruct"]
priority = "interactive"
policy = "strict"
[policies.strict]
prompt_injection = { flag = 0.3, block = 0.5 }
pii = { redact = 0.5 }
deny = ["internal codename", "a  b"]
output_pii = "redact"
guards = ["injection_rules", "pii"]
[models.big]
url = "http://127.0.0.1:9/v1"
timeout_secs = 5
[[tiers]]
name = "small"
model = "smollm2-135m-instruct"
""")
