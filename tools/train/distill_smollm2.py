#!/usr/bin/env python3
"""Self-distil a small Llama draft for SmolLM2-135M-Instruct (the GGUF champion), on CPU.

  python3 tools/train/distill_smollm2.py gen --minutes 35 --batch 48 --max-new 48   # data (resumable)
  python3 tools/train/distill_smollm2.py train --tag d64l4 --shape d64 --layers 4 --minutes 18   # (resumable)
  python3 tools/train/distill_smollm2.py export --tag d64l4 --out web/models/smollm2-draft
  python3 tools/train/distill_smollm2.py measure --draft web/models/smollm2-draft     # the real loop
  python3 tools/train/distill_smollm2.py simulate --draft web/models/smollm2-draft   # torch, same rule
  python3 tools/train/distill_smollm2.py time --draft web/models/smollm2-draft       # WASM, Node

Data recipe (docs/smollm2_draft.md): no external text and nothing from eval/corpus. The champion
samples user messages itself (chat template, open user turn, T = 1, top-p 0.95, a short opening
word to spread topics), answers them at T in {0, 0.7, 1.0}, and then answers templated
instructions (summarise / extract / rewrite / continue the dialogue, in chat and as plain
completions) filled with its own answers.
Every finished sequence gets one teacher forward; its top-K log-probabilities per position are
the soft targets. Everything goes to build/train/smollm2/ (git-ignored), appended in shards, so a
stopped run resumes where it was.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "py"))

WORK = os.path.join(REPO, "build", "train", "smollm2")
TOP_K = 32
IM_END = 2          # <|im_end|>, the champion's EOS
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
OPENERS = ["", "What", "How", "Why", "Can you", "Tell me", "Explain", "Write", "Give me", "Describe",
           "I", "Please", "Summarize", "List", "Who", "Is it", "My", "Help me", "Which", "When",
           "Could you", "Compare", "Translate", "Suggest", "Hi", "Hello", "Do you", "Write a poem",
           "Write a short story", "Write a scene", "Write a prayer", "Good morning", "Summarise"]
TEMPLATES = [     # chat instructions filled with the champion's own earlier answers
    "Summarise the passage below.\n{text}",
    "Summarize the following text in one sentence:\n\n{text}",
    "Give a short summary of this:\n{text}",
    "Say this again in plain, simple words: {text}",
    "{text}\n\nWhat is the main point of the text above?",
    "Extract the key facts from this text as a list:\n\n{text}",
    "Text: {text}\n\nQuote the first sentence exactly.",
    "{text}\n\nWhich names, places or numbers appear in this text?",
    "Read this and answer: what is it about?\n{text}",
    "Text: {text}\nQuestion: what does the text recommend?",
]
RAW_TEMPLATES = [  # the same without the chat template: plain completion
    "Summarise the following text.\n{text}\nSummary:",
    "{text}\n\nIn short:",
    "Put this in plain words: {text}\nPlain words:",
    "Text: {text}\n\nThe first sentence of the text is:",
    "{text}\nQuestion: what is this text about? Answer:",
    "Passage: {text}\nThe people and places named in the passage are",
    "{text}",
]
FOLLOW_UPS = ["Can you tell me more?", "Why is that?", "Can you give an example?", "Thanks! Can you make it shorter?",
              "What else should I know?", "Could you explain that more simply?", "Is that always true?"]


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


def gguf_path():
    with open(os.path.join(REPO, "build", "models", "status.json")) as f:
        status = json.load(f)
    if not status.get("available"):
        raise SystemExit(f"E_MODEL_LOAD: build/models/status.json: the SmolLM2 GGUF is unavailable ({status.get('reason')})")
    return os.path.join(REPO, "build", "models", status["path"])


def load_champion():
    """(model, tokenizer) as transformers loads the GGUF, float32 (weights dequantised by gguf)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    path = gguf_path()
    folder, name = os.path.split(path)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, gguf_file=name),
                                             dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in tensors.items()},
                          strict=False)
    model.tie_weights()
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=name)


# ----------------------------------------------------------------------------- gen
def chat_ids(tok, messages, open_user=False):
    if open_user:
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        if hasattr(ids, "input_ids") or isinstance(ids, dict):
            ids = ids["input_ids"]
        return list(ids) + tok.encode("<|im_start|>user\n", add_special_tokens=False)
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "input_ids") or isinstance(ids, dict):
        ids = ids["input_ids"]
    return list(ids)


def prompt_ids(tok, item):
    """A chat user message (str), a whole conversation (list), or ("raw", text): plain completion."""
    if isinstance(item, tuple):
        return tok.encode(item[1], add_special_tokens=False)
    return chat_ids(tok, item if isinstance(item, list) else [{"role": "user", "content": item}])


@torch.no_grad()
def generate(model, prompts, max_new, temperature, top_p=1.0):
    """Batched sampling with the KV cache; left padding. Returns the new ids of each prompt, cut
    after the first <|im_end|> (kept) or at max_new."""
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), IM_END, dtype=torch.long)
    mask = torch.zeros((len(prompts), n), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):] = torch.tensor(p)
        mask[i, n - len(p):] = 1
    kw = dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=temperature,
                                                               top_p=top_p, top_k=0)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=IM_END,
                         pad_token_id=IM_END, **kw)[:, n:].tolist()
    result = []
    for row in out:
        if IM_END in row:
            row = row[:row.index(IM_END) + 1]
        result.append(row)
    return result


@torch.no_grad()
def soft_targets(model, seqs):
    """One teacher forward over each finished sequence: top-K log-probs and their ids per position."""
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), IM_END, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    logp = F.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    vals, idx = logp.topk(TOP_K, dim=-1)
    return [(vals[i, :len(s)].to(torch.float16).numpy(), idx[i, :len(s)].to(torch.int32).numpy())
            for i, s in enumerate(seqs)]


def save_shard(records, kind):
    os.makedirs(WORK, exist_ok=True)
    k = len(glob.glob(os.path.join(WORK, "shard_*.pt")))
    path = os.path.join(WORK, f"shard_{k:04d}_{os.getpid()}.pt")   # pid: several gen processes may share WORK
    torch.save({"kind": kind, "records": records}, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def load_records():
    recs = []
    for p in sorted(glob.glob(os.path.join(WORK, "shard_*.pt"))):
        recs.extend(torch.load(p, weights_only=False)["records"])
    return recs


def cmd_gen(args):
    torch.set_num_threads(args.threads)
    model, tok = load_champion()
    rnd = random.Random(args.seed + len(glob.glob(os.path.join(WORK, "shard_*.pt"))))
    torch.manual_seed(rnd.randrange(1 << 30))
    deadline = time.time() + 60 * args.minutes
    system = [{"role": "system", "content": SYSTEM}]
    answered = [r for r in load_records() if r.get("text")]
    while time.time() < deadline:
        t0 = time.time()
        b = args.batch
        # 1. user messages written by the champion
        openers = [rnd.choice(OPENERS) for _ in range(b)]
        heads = [chat_ids(tok, system, open_user=True) + (tok.encode(o, add_special_tokens=False) if o else [])
                 for o in openers]
        tails = generate(model, heads, 40, 1.0, top_p=0.95)
        users = []
        for o, t in zip(openers, tails):
            text = (o + tok.decode(t, skip_special_tokens=True) if o else tok.decode(t, skip_special_tokens=True))
            text = text.strip()
            if len(text) >= 8:
                users.append(text)
        # 2. templated instructions, follow-ups and plain completions on the champion's own answers
        for _ in range(b // 2):
            if not answered:
                break
            prev = rnd.choice(answered)
            roll = rnd.random()
            if roll < 0.4:
                users.append(rnd.choice(TEMPLATES).format(text=prev["text"]))
            elif roll < 0.6:
                users.append([{"role": "user", "content": prev["user"]},
                              {"role": "assistant", "content": prev["text"]},
                              {"role": "user", "content": rnd.choice(FOLLOW_UPS)}])
            else:
                text = prev["text"]
                template = rnd.choice(RAW_TEMPLATES)
                if template == "{text}":   # continue the first part of an answer
                    text = text[:max(20, len(text) // 2)]
                users.append(("raw", template.format(text=text)))
        temps = [rnd.choice([0.0, 0.7, 1.0]) for _ in users]
        records = []
        for temp in (0.0, 0.7, 1.0):
            group = [u for u, t in zip(users, temps) if t == temp]
            if not group:
                continue
            prompts = [prompt_ids(tok, u) for u in group]
            answers = generate(model, prompts, args.max_new, temp)
            seqs = [p + a for p, a in zip(prompts, answers)]
            for u, p, a, s, (v, i) in zip(group, prompts, answers, seqs, soft_targets(model, seqs)):
                user = u if isinstance(u, str) else u[-1]["content"] if isinstance(u, list) else u[1]
                records.append({"ids": np.asarray(s, dtype=np.int32), "prompt_len": len(p), "temp": temp,
                                "chat": not isinstance(u, tuple),
                                "user": user, "text": tok.decode(a, skip_special_tokens=True).strip(),
                                "top_logp": v, "top_ids": i})
        answered.extend(r for r in records if len(r["text"]) > 40 and r["chat"])
        path = save_shard(records, "chat")
        ntok = sum(len(r["ids"]) - r["prompt_len"] for r in records)
        log(f"{path}: {len(records)} sequences, {ntok} answer tokens, {time.time() - t0:.0f} s")



# ----------------------------------------------------------------------------- train
SHAPES = {   # hidden, intermediate, layers, heads, kv heads, head_dim
    "d64": (64, 256, 2, 2, 1, 32),
    "d96": (96, 288, 2, 3, 1, 32),
    "d128": (128, 384, 2, 2, 1, 64),
    "d192": (192, 512, 4, 3, 1, 64),
}


def draft_conf(shape, layers=None, input_rows=0, head_rows=0):
    from model import LlamaConf
    h, i, n, nh, nkv, hd = SHAPES[shape]
    return LlamaConf(vocab_size=49152, hidden_size=h, intermediate_size=i, num_hidden_layers=layers or n,
                     num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
                     max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                     input_rows=input_rows, head_rows=head_rows)


def restricted_vocabulary(records, input_rows, head_rows):
    """(embed_rows (V,), head_ids (N,)) of a restricted-vocabulary draft, from the training data
    only. The head scores N tokens: the N/2 lowest ids (BPE merge order, roughly the tokenizer
    corpus' frequency order) and then the tokens with the most champion probability mass (the
    stored top-K) in the data. The embedding has M = input_rows rows: the (M-1)/2 lowest ids, then
    the most frequent tokens in the data (prompts and answers), and a last row shared by every
    other token."""
    V = 49152
    mass = np.zeros(V, dtype=np.float64)
    count = np.zeros(V, dtype=np.int64)
    for r in records:
        np.add.at(mass, r["top_ids"].reshape(-1), np.exp(r["top_logp"].astype(np.float64)).reshape(-1))
        np.add.at(count, r["ids"], 1)

    def pick(score, n):
        chosen = list(range(n // 2))
        seen = set(chosen)
        for t in np.argsort(-score, kind="stable"):
            if len(chosen) == n:
                break
            if int(t) not in seen:
                chosen.append(int(t))
                seen.add(int(t))
        return np.array(sorted(chosen), dtype=np.int64)

    head_ids = pick(mass, head_rows)
    inputs = pick(count.astype(np.float64), input_rows - 1)
    embed_rows = np.full(V, input_rows - 1, dtype=np.int64)
    embed_rows[inputs] = np.arange(len(inputs))
    return embed_rows, head_ids


def pca_embedding(d):
    """The champion's token embedding projected on its d leading principal directions."""
    from exactspec.formats.gguf_model import GGUFModel
    with GGUFModel(gguf_path()) as m:
        e = torch.as_tensor(np.asarray(m.read_float32("model.embed_tokens.weight"), dtype=np.float32))
    centred = e - e.mean(0, keepdim=True)
    _, _, v = torch.linalg.svd(centred[::4], full_matrices=False)   # every 4th row: same directions, 4x cheaper
    return centred @ v[:d].T


def split_records(records):
    """Every 40th sequence is held out (never trained on)."""
    train = [r for i, r in enumerate(records) if i % 40 != 7]
    held = [r for i, r in enumerate(records) if i % 40 == 7]
    return train, held


def make_batch(recs, max_len):
    n = min(max_len, max(len(r["ids"]) for r in recs))
    x = torch.full((len(recs), n), IM_END, dtype=torch.long)
    tv = torch.full((len(recs), n, TOP_K), -1e4, dtype=torch.float32)
    ti = torch.zeros((len(recs), n, TOP_K), dtype=torch.long)
    mask = torch.zeros((len(recs), n), dtype=torch.float32)
    answer = torch.zeros((len(recs), n), dtype=torch.bool)
    for b, r in enumerate(recs):
        m = min(n, len(r["ids"]))
        x[b, :m] = torch.as_tensor(r["ids"][:m].astype(np.int64))
        tv[b, :m] = torch.as_tensor(r["top_logp"][:m].astype(np.float32))
        ti[b, :m] = torch.as_tensor(r["top_ids"][:m].astype(np.int64))
        mask[b, :m - 1] = 1.0                     # the last position predicts past the sequence
        answer[b, r["prompt_len"] - 1:m - 1] = True
    return x, tv, ti, mask, answer


def batches(records, tokens_per_batch, max_len, rnd):
    order = sorted(records, key=lambda r: len(r["ids"]) + rnd.random() * 40)
    out, cur = [], []
    for r in order:
        if cur and (len(cur) + 1) * min(max_len, len(r["ids"])) > tokens_per_batch:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    rnd.shuffle(out)
    return out


def distill_loss(logits, tv, ti, mask, keep=None):
    """Cross-entropy of the draft against the champion's top-K distribution (renormalised);
    ti indexes the columns of logits. keep (B, T, K): the teacher entries the draft can score
    (a restricted head: the others are outside its support and carry no weight)."""
    logq = F.log_softmax(logits.float(), dim=-1).gather(-1, ti)
    p = F.softmax(tv, dim=-1)
    if keep is not None:
        p = p * keep
    per_pos = -(p * logq).sum(-1)
    return (per_pos * mask).sum() / mask.sum()


@torch.no_grad()
def agreement(model, held, allowed=None, max_len=320):
    """On the held-out answers: greedy top-1 agreement with the champion, and sum(min(p, q)) over
    the champion's top-K (a lower bound of the T = 1 acceptance). allowed: a bool mask over the
    vocabulary (the restricted head: the draft's probability is exactly 0 outside it)."""
    greedy = accept = count = 0.0
    for i in range(0, len(held), 8):
        x, tv, ti, mask, answer = make_batch(held[i:i + 8], max_len)
        logits = model(x).float()
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        q = F.softmax(logits, dim=-1)
        greedy += ((q.argmax(-1) == ti[..., 0]) & answer).sum().item()
        accept += (torch.minimum(tv.exp(), q.gather(-1, ti)).sum(-1) * answer).sum().item()
        count += answer.sum().item()
    return greedy / count, accept / count


def token_frequencies(records):
    counts = np.zeros(49152, dtype=np.int64)
    for r in records:
        np.add.at(counts, r["ids"][r["prompt_len"]:], 1)
    return counts


def cmd_train(args):
    from model import Llama
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rnd = random.Random(args.seed)
    records = load_records()
    train, held = split_records(records)
    ntok = sum(len(r["ids"]) for r in train)
    rdir = os.path.join(WORK, args.tag)
    os.makedirs(rdir, exist_ok=True)
    ckpt_path = os.path.join(rdir, "ckpt.pt")
    conf = draft_conf(args.shape, args.layers, args.input_rows, args.head_rows)
    model = Llama(conf)
    if conf.head_rows:
        embed_rows, head_ids = restricted_vocabulary(train, conf.input_rows, conf.head_rows)
        model.embed_rows.copy_(torch.as_tensor(embed_rows))
        model.head_ids.copy_(torch.as_tensor(head_ids))
    step, elapsed, epoch = 0, 0.0, 0
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, epoch = ck["step"], ck["elapsed"], ck["epoch"]
        log(f"resumed {ckpt_path} step {step} elapsed {elapsed:.0f}s")
    elif args.pca:
        with torch.no_grad():
            pca = pca_embedding(conf.hidden_size)                        # (V, d)
            if conf.head_rows:
                rows = model.embed_rows
                shared = rows == conf.input_rows - 1
                model.model.embed_tokens.weight[rows[~shared]] = pca[~shared]
                model.model.embed_tokens.weight[-1] = pca[shared].mean(0)
                model.lm_head.weight.copy_(pca[model.head_ids])
            else:
                model.model.embed_tokens.weight.copy_(pca)
    budget = 60 * args.minutes
    log(f"{args.tag}: {model.num_params()} params, {len(train)} train sequences ({ntok} tokens), "
        f"{len(held)} held out, budget {budget:.0f}s")

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "epoch": epoch, "conf": conf.to_dict(), "args": vars(args)}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    frequent = torch.as_tensor(np.argsort(-token_frequencies(train))[:args.candidates].copy())
    head_column = torch.full((49152,), -1, dtype=torch.long)     # (V,) token -> head row, -1 off the head
    if conf.head_rows:
        head_column[model.head_ids] = torch.arange(conf.head_rows)
    last_save, done = elapsed, False
    while not done:
        for batch in batches(train, args.tokens_per_batch, args.max_len, random.Random(args.seed + epoch)):
            if elapsed >= budget:
                done = True
                break
            t0 = time.time()
            progress = min(1.0, elapsed / budget)
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
            for g in opt.param_groups:
                g["lr"] = lr
            x, tv, ti, mask, _ = make_batch(batch, args.max_len)
            if conf.head_rows:
                # the restricted head's own N columns; teacher ids outside it carry no weight
                col = head_column[ti]
                loss = distill_loss(model.head_logits(x), tv, col.clamp_min(0), mask, keep=col >= 0)
            elif args.candidates:
                # the softmax over the batch's teacher top-K ids and the most frequent tokens only
                # (5-8x cheaper than 49152 columns on this CPU); the exported draft has the full head
                cand = torch.unique(torch.cat([ti[mask > 0].flatten(), frequent]))
                column = torch.full((49152,), 0, dtype=torch.long)
                column[cand] = torch.arange(len(cand))
                logits = F.linear(model.hidden(x), model.model.embed_tokens.weight[cand])
                loss = distill_loss(logits, tv, column[ti], mask)
            else:
                loss = distill_loss(model(x), tv, ti, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            elapsed += time.time() - t0
            if step % 20 == 0:
                log(f"step {step} epoch {epoch} loss {loss.item():.4f} lr {lr:.2e} elapsed {elapsed:.0f}s")
            if elapsed - last_save > 300:
                save()
                last_save = elapsed
        else:
            epoch += 1
    save()
    model.eval()
    g, a = agreement(model, held)
    log(f"{args.tag}: held-out greedy agreement {g:.4f}, sum(min(p,q)) over top-{TOP_K} {a:.4f}")
    freq = token_frequencies(train)
    rank = np.argsort(-freq)
    result = {"tag": args.tag, "params": model.num_params(), "steps": step, "elapsed_s": round(elapsed),
              "train_tokens": ntok, "held_out_sequences": len(held), "greedy_agreement": g, "min_pq": a,
              "restricted": {}}
    for n in (1024, 4096, 8192, 16384):
        allowed = torch.zeros(49152, dtype=torch.bool)
        allowed[torch.as_tensor(rank[:n].copy())] = True
        rg, ra = agreement(model, held, allowed)
        result["restricted"][n] = {"greedy_agreement": rg, "min_pq": ra}
        log(f"{args.tag}: head restricted to the {n} most frequent tokens: greedy {rg:.4f}, min(p,q) {ra:.4f}")
    with open(os.path.join(rdir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)



# ----------------------------------------------------------------------------- export
def write_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def cmd_export(args):
    """A Hugging Face Llama folder: config.json, generation_config.json, model.safetensors (f32 or
    bf16, lm_head tied), and the champion's tokenizer rebuilt from the GGUF by exactspec.formats.gguf_tokenizer
    (tokenizer.json is the canonical JSON whose sha256 is the GGUF pair's tokenizer identity)."""
    from safetensors.torch import save_file
    from model import Llama, LlamaConf, hf_config
    from exactspec.formats.gguf import GGUFFile
    from exactspec.formats.gguf_tokenizer import stop_token_ids, tokenizer_config, tokenizer_spec
    from exactspec.formats.manifest import canonical_json
    ck = torch.load(os.path.join(WORK, args.tag, "ckpt.pt"), map_location="cpu", weights_only=False)
    conf = LlamaConf(**ck["conf"])
    model = Llama(conf)
    model.load_state_dict(ck["model"])
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
             if k not in ("head_ids", "embed_rows")}
    if conf.head_rows:   # the engine's restricted-vocabulary tensors (docs/draft_wasm.md)
        state["exactspec.head_ids"] = model.head_ids.to(torch.int32).contiguous()
        state["exactspec.embed_rows"] = model.embed_rows.to(torch.int32).contiguous()
    with GGUFFile(gguf_path()) as f:
        spec, tok_config, stops = tokenizer_spec(f), tokenizer_config(f), stop_token_ids(f)
    os.makedirs(args.out, exist_ok=True)
    save_file(state, os.path.join(args.out, "model.safetensors"),
              metadata={"format": "pt", "exactspec_step": str(ck["step"]), "exactspec_recipe": "tools/train/distill_smollm2.py",
                        "exactspec_champion_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"})
    vocab = {t["content"]: t["id"] for t in spec["added_tokens"]}
    cfg = hf_config(conf)
    cfg.update(torch_dtype={"f32": "float32", "bf16": "bfloat16"}[args.dtype],
               bos_token_id=vocab.get(tok_config.get("bos_token")), eos_token_id=stops[0],
               pad_token_id=vocab.get(tok_config.get("pad_token")))
    write_json(os.path.join(args.out, "config.json"), cfg)
    write_json(os.path.join(args.out, "generation_config.json"),
               {"bos_token_id": cfg["bos_token_id"], "eos_token_id": list(stops), "pad_token_id": cfg["pad_token_id"]})
    with open(os.path.join(args.out, "tokenizer.json"), "wb") as out:
        out.write(canonical_json(spec))
    write_json(os.path.join(args.out, "tokenizer_config.json"), tok_config)
    size = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    log(f"exported {args.tag} ({model.num_params()} params, {args.dtype}) -> {args.out}: {size} bytes")


# ----------------------------------------------------------------------------- measure
STRATA = ("dialogue", "summary", "extraction")


def eval_prompts(pair):
    """(stratum, id, prompt ids, max_new_tokens, seed) of the dialogue, summary and extraction strata."""
    from exactspec.formats.chat import encode_chat_prompt
    out = []
    for stratum in STRATA:
        with open(os.path.join(REPO, "eval", "corpus", f"{stratum}.jsonl")) as f:
            for line in f:
                item = json.loads(line)
                if item.get("split") == "test":     # the locked test split: only `exactspec bench --split test`
                    continue
                if item.get("chat"):
                    ids = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config, [{"role": "user", "content": item["prompt"]}])
                else:
                    ids = pair.tokenizer.encode(item["prompt"])
                out.append((stratum, item["id"], ids, item.get("max_new_tokens", 32), item.get("seed", 0)))
    return out


def cmd_measure(args):
    """Tokens per round at k with the project's CPython orchestrator: the GGUF champion on the
    NumPy reference (gguf_pair) and the draft folder on LlamaReference; greedy, then T = 1 seeds."""
    from exactspec.core.backends import RunnerDraft
    from exactspec.reference.gguf_pair import load_gguf_pair
    from exactspec.core.orchestrator import GenerationConfig, Orchestrator
    from exactspec.core.policy import SamplingPolicy
    from exactspec.reference.reference_llama import LlamaReference
    pair = load_gguf_pair(gguf_path())
    base = pair.orchestrator
    orch = Orchestrator(base.champion, RunnerDraft(LlamaReference.from_dir(args.draft)), decode=base.decode,
                        identities={k: v for k, v in base.identities.items() if k != "champion"})
    prompts = eval_prompts(pair)
    runs = [("greedy", 0.0, [0])] + [("T=1", 1.0, list(range(args.seeds)))]
    report = {"draft": args.draft, "k": args.k, "max_new_tokens": args.max_new, "rows": []}
    for name, temp, seeds in runs:
        totals = {}
        for stratum, pid, ids, max_new, seed in prompts:
            for s in seeds:
                config = GenerationConfig(max_new_tokens=args.max_new or max_new, k=args.k, speculate="draft",
                                          policy=SamplingPolicy(temperature=temp), seed=seed + 1000 * s,
                                          stop_token_ids=pair.stop_token_ids)
                r = orch.generate(ids, config)
                st = r.stats
                t = totals.setdefault(stratum, [0, 0])
                t[0] += st["accepted"] + st["rounds"]
                t[1] += st["rounds"]
                report["rows"].append({"mode": name, "id": pid, "seed": s, "rounds": st["rounds"],
                                       "accepted": st["accepted"], "tokens": len(r.token_ids),
                                       "tokens_per_round": st["tokens_per_round"], "text": r.text[:80]})
                log(f"{name} {pid} seed {s}: {st['tokens_per_round']} tokens/round over {st['rounds']} rounds")
        every = [sum(t[0] for t in totals.values()), sum(t[1] for t in totals.values())]
        summary = {k: round(v[0] / v[1], 3) for k, v in totals.items()}
        summary["all"] = round(every[0] / every[1], 3)
        report[name] = summary
        log(f"{name}: tokens per round at k={args.k}: {summary}")
    if args.out:
        write_json(args.out, report)


@torch.no_grad()
def simulate_round(champion, cache, draft, context, pending, k, temperature, gen):
    """One speculative round in torch (the exact rule of exactspec.core.acceptance on plain softmax rows):
    the draft proposes k tokens, the champion verifies pending + proposals through its KV cache.
    Returns (accepted, emitted tokens)."""
    proposal, q_rows = [], []
    seq = list(context)
    for _ in range(k):
        row = draft(torch.tensor([seq]))[0, -1].float()
        if temperature == 0:
            token = int(row.argmax())
        else:
            q = F.softmax(row / temperature, dim=-1)
            token = int(torch.multinomial(q, 1, generator=gen))
            q_rows.append(q)
        proposal.append(token)
        seq.append(token)
    feed = pending + proposal
    logits = champion(input_ids=torch.tensor([feed]), past_key_values=cache, use_cache=True).logits[0].float()
    rows = logits[len(pending) - 1:]                       # rows[j] predicts proposal[j]; rows[k] the bonus
    out = []
    for j, token in enumerate(proposal):
        if temperature == 0:
            best = int(rows[j].argmax())
            if best != token:
                return j, out + [best]
        else:
            p = F.softmax(rows[j] / temperature, dim=-1)
            q = q_rows[j]
            if torch.rand((), generator=gen) * q[token] >= p[token]:
                residual = (p - q).clamp_min(0)
                return j, out + [int(torch.multinomial(residual / residual.sum(), 1, generator=gen))]
        out.append(token)
        if token == IM_END:
            return j + 1, out
    bonus = int(rows[k].argmax()) if temperature == 0 else int(torch.multinomial(F.softmax(rows[k] / temperature, -1), 1, generator=gen))
    return k, out + [bonus]


@torch.no_grad()
def simulate(champion, draft, prompt, max_new, k, temperature, seed):
    """(accepted + rounds, rounds) of one request, as the orchestrator counts them (static k =
    min(k, remaining), a round emits at most k + 1 tokens, EOS ends)."""
    from transformers import DynamicCache
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    champion(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
    context, pending, total, rounds = list(prompt), [prompt[-1]], 0, 0
    while len(context) - len(prompt) < max_new:
        kk = min(k, max_new - (len(context) - len(prompt)))
        accepted, tokens = simulate_round(champion, cache, draft, context, pending, kk, temperature, gen)
        tokens = tokens[:max_new - (len(context) - len(prompt))]
        surplus = cache.get_seq_length() - (len(context) + accepted)   # keep the prefix and accepted proposals
        if surplus > 0:
            cache.crop(-surplus)
        total, rounds = total + accepted + 1, rounds + 1
        context += tokens
        pending = [tokens[-1]]
        if IM_END in tokens:
            break
    return total, rounds


def load_torch_draft(folder):
    from safetensors.torch import load_file
    from model import Llama, LlamaConf
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    conf = LlamaConf(**{k: cfg[k] for k in LlamaConf.__dataclass_fields__ if k in cfg})
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    if "exactspec.head_ids" in tensors:
        conf.head_rows = tensors["exactspec.head_ids"].shape[0]
        conf.input_rows = tensors["model.embed_tokens.weight"].shape[0]
    model = Llama(conf)
    state = {k: v.float() for k, v in tensors.items() if not k.startswith("exactspec.")}
    if conf.head_rows:
        state["head_ids"] = tensors["exactspec.head_ids"].long()
        state["embed_rows"] = tensors["exactspec.embed_rows"].long()
    model.load_state_dict(state)
    return model.eval()


def cmd_simulate(args):
    """Tokens per round at k in a torch simulation of the exact rule (transformers' float32 champion
    from the GGUF, the draft folder in tools/train/model.py): greedy, and T = 1 over --seeds seeds."""
    from exactspec.formats.gguf import GGUFFile
    from exactspec.formats.gguf_tokenizer import load_tokenizer, tokenizer_config
    from exactspec.reference.models import LoadedPair
    torch.set_num_threads(args.threads)
    champion, _ = load_champion()
    with GGUFFile(gguf_path()) as f:
        pair = LoadedPair(None, load_tokenizer(f), tokenizer_config(f), (IM_END,), None)
    report = {"draft": args.draft, "k": args.k, "label": "torch simulation of the exact rule"}
    allowed = None
    if args.restrict:   # technique 2: the head restricted to the N most frequent answer tokens
        rank = np.argsort(-token_frequencies(split_records(load_records())[0]))
        allowed = torch.zeros(49152, dtype=torch.bool)
        allowed[torch.as_tensor(rank[:args.restrict].copy())] = True
        report["restricted_to"] = args.restrict
    for folder in args.draft:
        draft = load_torch_draft(folder)
        if allowed is not None:
            full = draft
            draft = lambda x, full=full: full(x).masked_fill(~allowed, float("-inf"))
        for name, temp, seeds in (("greedy", 0.0, [0]), ("T=1", 1.0, list(range(args.seeds)))):
            totals = {}
            for stratum, pid, ids, max_new, seed in eval_prompts(pair):
                for s in seeds:
                    a, r = simulate(champion, draft, ids, args.max_new or max_new, args.k, temp, seed + 1000 * s)
                    t = totals.setdefault(stratum, [0, 0])
                    t[0] += a
                    t[1] += r
            summary = {k: round(v[0] / v[1], 3) for k, v in totals.items()}
            summary["all"] = round(sum(v[0] for v in totals.values()) / sum(v[1] for v in totals.values()), 3)
            report.setdefault(folder, {})[name] = summary
            log(f"simulated {folder} {name}: tokens per round at k={args.k}: {summary}")
    if args.out:
        write_json(args.out, report)


def cmd_time(args):
    """ms per WASM draft proposal (the draft half of web/build/cpu.wasm in Node, web/tests/draft_harness.mjs
    timePropose), for a folder with F32 weights."""
    import subprocess
    import tempfile
    cases = {"wasm": os.path.join(REPO, "web", "build", "cpu.wasm"), "model_dir": os.path.abspath(args.draft),
             "timing": {"k": args.k, "reps": args.reps, "policy": {"temperature": args.temperature}}}
    with tempfile.TemporaryDirectory() as tmp:
        cin, cout = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
        with open(cin, "w") as f:
            json.dump(cases, f)
        subprocess.run(["node", os.path.join(REPO, "web", "tests", "draft_harness.mjs"), cin, cout], check=True)
        with open(cout) as f:
            timing = json.load(f)["timing"]
    log(f"{args.draft}: WASM draft {timing}")
    print(json.dumps(timing))


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--minutes", type=float, default=35)
    g.add_argument("--batch", type=int, default=24)
    g.add_argument("--max-new", type=int, default=96)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train")
    t.add_argument("--tag", required=True)
    t.add_argument("--shape", choices=sorted(SHAPES), default="d64")
    t.add_argument("--layers", type=int, default=None)
    t.add_argument("--input-rows", type=int, default=0, help="restricted embedding: M rows (with --head-rows)")
    t.add_argument("--head-rows", type=int, default=0, help="restricted head: N tokens, untied lm_head")
    t.add_argument("--minutes", type=float, default=30)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--tokens-per-batch", type=int, default=2048)
    t.add_argument("--max-len", type=int, default=320)
    t.add_argument("--no-pca", dest="pca", action="store_false")
    t.add_argument("--candidates", type=int, default=2048,
                   help="softmax over the batch's teacher ids + this many frequent tokens (0: all 49152)")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("export")
    e.add_argument("--tag", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    m = sub.add_parser("measure")
    m.add_argument("--draft", required=True)
    m.add_argument("--k", type=int, default=4)
    m.add_argument("--seeds", type=int, default=3)
    m.add_argument("--max-new", type=int, default=0, help="0: each prompt's max_new_tokens")
    m.add_argument("--out")
    sm = sub.add_parser("simulate")
    sm.add_argument("--draft", required=True, nargs="+")
    sm.add_argument("--k", type=int, default=4)
    sm.add_argument("--seeds", type=int, default=5)
    sm.add_argument("--max-new", type=int, default=0, help="0: each prompt's max_new_tokens")
    sm.add_argument("--threads", type=int, default=1)
    sm.add_argument("--restrict", type=int, default=0, help="mask the draft's head to the N most frequent tokens")
    sm.add_argument("--out")
    w = sub.add_parser("time")
    w.add_argument("--draft", required=True)
    w.add_argument("--k", type=int, default=4)
    w.add_argument("--reps", type=int, default=30)
    w.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    {"gen": cmd_gen, "train": cmd_train, "export": cmd_export, "measure": cmd_measure, "simulate": cmd_simulate, "time": cmd_time}[args.cmd](args)


if __name__ == "__main__":
    main()
