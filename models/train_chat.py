"""Train the project's tiny chat model (torch, CPU) on conversations the project generates.

Primitives:
- ``ChatTrainConfig``: steps, batch, learning-rate schedule, conversation lengths, seeds.
- ``chat_model_config(vocab_size)``: the geometry (Llama, d_model 128, 4 layers, 4 query / 2 KV
  heads of 32, SwiGLU 384, context 512).
- ``encode_conversation(tok, conv, max_len) -> (ids, reply_mask)``: llama.cpp's tokens of the
  rendered conversation (BOS first, whole turns dropped from the end until it fits) and which
  tokens are reply tokens (each assistant message's content and the EOS after it).
- ``make_batch(tcfg, step, tok) -> (inputs, targets, reply_mask, valid)``: the step's batch, a pure
  function of the seed and the step: conversations of one kind and turn count (drawn per step),
  padded to the longest (``valid`` masks pads). Kinds: ordinary (1-``max_turns`` turns), long
  (``long_frac``: every position up to the context length is trained), tool conversations
  (``tools_frac``; their task kinds drawn by ``tool_kind_weights``), name recall (``recall_frac``,
  the question 2-10 turns after the name) and forced JSON (``forced_json_frac``).
- ``forced_json_conversation(rng)``: one turn of any family answered with a JSON object, as
  ``response_format`` makes a model answer; the ``{`` the grammar forces is left out of the loss.
- ``warm_start(model, vocab, init_dir, sha256)``: start from an earlier chat checkpoint; the
  embedding and output rows follow the token texts (new tokens start fresh).
- ``chat_loss(logits, targets, reply, valid, lm_weight)``: mean NLL of the reply tokens plus
  ``lm_weight`` times the mean NLL of the other real tokens.
- ``reply_accuracy(model, tok, conversations) -> (exact, by_family)``: share of replies whose every
  token (EOS included) is the argmax under teacher forcing, which is what greedy decoding gives.
- CLI: ``python models/train_chat.py`` trains, saves ``models/chat.{npz,json}``, exports
  ``models/chat.gguf``, measures accuracy in torch and llama.cpp (``models.chat_eval``) and writes
  ``models/CHAT_MANIFEST.json`` and ``models/chat_train_log.json``. ``--init-dir`` names the
  warm start's folder (``ChatTrainConfig.init_sha256``: phase 5, ``git show
  48dba68:models/chat.npz``); ``--snapshot-dir`` writes a GGUF every 250 steps; ``--smoke`` runs a
  tiny version (``--out-dir`` a scratch folder); ``--check-log N`` re-trains N steps and compares
  the log.

The Llama module, its GGUF tensor names, the learning-rate schedule and the torch set-up are
``models.train_passkey``'s. Deterministic as that one is: fixed seeds, a fixed thread count, deterministic
algorithms, batches derived from (seed, step) only.

Committed run: phase 6 of a chain of warm starts (the first chat model, 2,500 steps from
scratch; phase 1, 1,400 steps on the tool / JSON / recall mix; phase 2, 700 steps; phase 3, 800
steps with more tool conversations; phase 4, 1,600; phase 5, 1,200 with summed lookups weighted
up; this one, 600 steps from phase 5 with forced JSON), 1 thread of a shared 2-core machine. See CHAT_MANIFEST.json
and models/README.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make "models" importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

from models import chat_tasks as ct
from models.chat_vocab import CHAT_TEMPLATE, EOS_ID, ChatTokenizer, Vocab, build_vocab, render
from models.checkpoint import ModelConfig, load_checkpoint, save_checkpoint, sha256_file
from models.train_passkey import LlamaModel, lr_at, setup_torch, to_arrays

HERE = Path(__file__).resolve().parent
STEM = "chat"
# the chat.npz this model starts from (`git show <BASE_COMMIT>:models/chat.npz`, chat.json beside it):
# phase 5, committed at 48dba68 (1,200 steps from phase 4, 89e0e11: 1,600 steps from phase 3, d87d19d:
# 800 steps from phase 2, 443dda7: 700 steps from phase 1, 24fbf9b: 1,400 steps on the tool / JSON /
# recall mix from the first chat model, b9639e3: 2,500 from scratch)
BASE_SHA256 = "57b60942ac07d02ad4ca24944ad0e66cf1b7799f5559a807b59e75e107ba1ec0"
BASE_COMMIT = "48dba68"


@dataclass(frozen=True)
class ChatTrainConfig:
    steps: int = 600
    batch_tokens: int = 4096  # padded tokens per batch: conversations are added while they fit
    min_batch: int = 4
    max_batch: int = 128
    lr: float = 3e-4
    min_lr_frac: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    lm_weight: float = 0.1
    max_turns: int = 6  # ordinary conversations: 1..max_turns turns
    long_frac: float = 0.05  # share of steps made of long conversations ...
    long_min_turns: int = 7
    long_max_turns: int = 30  # ... cut to whole turns that fit the context
    tools_frac: float = 0.5  # ... of tool conversations (ct.tool_conversation)
    tool_kind_weights: tuple[float, ...] = (2, 3, 3, 2, 6)  # chat_tools.TASK_KINDS in the tool conversations
    recall_frac: float = 0.1  # ... of name-recall conversations (ct.name_recall_conversation)
    forced_json_frac: float = 0.1  # ... of one-turn replies in JSON whatever the question (forced_json_conversation)
    recall_min_gap: int = 2
    recall_max_gap: int = 10
    recall_made_up_p: float = 0.0  # made-up names in the recall conversations (ordinary ones keep 15%)
    seed: int = 1234  # torch init
    data_seed: int = 7654  # batches
    threads: int = 1  # on a shared, loaded 2-core machine one thread ran 3-10x faster than two
    init_sha256: str = BASE_SHA256  # warm start: the sha256 of the chat.npz the weights start from ("" = from scratch)


def chat_model_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
                       d_ff=384, context_length=512)


def chat_vocab() -> Vocab:
    return build_vocab(ct.corpus_words())


# ---------------------------------------------------------------------------------------------
# data


def reply_spans(ids: Sequence[int], assistant_id: int, newline_id: int) -> list[tuple[int, int]]:
    """Half-open token ranges of each reply: after ``<|assistant|>`` ``\\n``, through its EOS."""
    spans = []
    for i, t in enumerate(ids):
        if t != assistant_id or i + 1 >= len(ids) or ids[i + 1] != newline_id:
            continue
        start = i + 2
        try:
            end = list(ids).index(EOS_ID, start) + 1
        except ValueError:
            break  # the generation prompt: no reply yet
        spans.append((start, end))
    return spans


def encode_conversation(
    tok: ChatTokenizer, conv: ct.Conversation, max_len: int
) -> tuple[list[int], np.ndarray]:
    """Tokens of the rendered conversation and the reply mask (``mask[p]``: token p is a reply token)."""
    messages = list(conv.messages)
    while True:
        ids = tok.tokenize(render(messages, tools=conv.tools), add_bos=True, special=True)
        if len(ids) <= max_len:
            break
        messages.pop()
        while messages and messages[-1]["role"] != "assistant":
            messages.pop()
        if not messages:
            raise ValueError(f"the first reply is past the {max_len}-token limit")
    assistant, newline = tok.tokenize("<|assistant|>", False, True)[0], tok.tokenize("\n", False, True)[0]
    mask = np.zeros(len(ids), dtype=bool)
    forced = FORCED_JSON in conv.families
    for a, b in reply_spans(ids, assistant, newline):
        mask[a + forced:b] = True
    return ids, mask


FORCED_JSON = "json_forced"  # the family of a reply whose first token a grammar chose, not the model


def forced_json_conversation(rng: random.Random) -> ct.Conversation:
    """One turn of any family answered with a JSON object, as ``response_format`` makes a model
    answer whatever it was asked: the grammar forces the ``{``, so training leaves that token out
    (``encode_conversation``) and teaches what follows: short values, closed strings, the end."""
    from models.chat_tools import JSON_KEYS, json_value

    conv = ct.make_conversation(rng, 1, 1)
    answer = str(conv.messages[-1]["content"]).rstrip(".")
    if conv.families[-1] == "json":  # asked for JSON: its reply is the one
        reply = str(conv.messages[-1]["content"])
    elif rng.random() < 0.5:
        value: Any = int(answer) if answer.isdigit() else (answer == "yes") if answer in ("yes", "no") else answer
        reply = json.dumps({"answer": value}, ensure_ascii=False)
    else:
        keys = rng.sample(sorted(JSON_KEYS), rng.randint(1, 3))
        reply = json.dumps({k: json_value(rng, JSON_KEYS[k]) for k in keys})
    return ct.Conversation([*conv.messages[:-1], {"role": "assistant", "content": reply}], [FORCED_JSON], None)


def step_conversation(tcfg: ChatTrainConfig, rng: random.Random, kind: str, turns: int) -> ct.Conversation:
    if kind == "forced_json":
        return forced_json_conversation(rng)
    if kind == "recall":
        return ct.name_recall_conversation(rng, tcfg.recall_min_gap, tcfg.recall_max_gap, tcfg.recall_made_up_p)
    if kind == "tools":
        return ct.tool_conversation(rng, tcfg.tool_kind_weights)
    return ct.make_conversation(rng, turns, turns)


def make_batch(
    tcfg: ChatTrainConfig, step: int, tok: ChatTokenizer, max_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = random.Random(f"chat-train/{tcfg.data_seed}/{step}")
    # one kind (and turn count) per step keeps the lengths in a batch close (little padding)
    r = rng.random()
    edges = np.cumsum([tcfg.long_frac, tcfg.tools_frac, tcfg.recall_frac, tcfg.forced_json_frac])
    kind = ("long", "tools", "recall", "forced_json", "plain")[int(np.searchsorted(edges, r, side="right"))]
    turns = (rng.randint(tcfg.long_min_turns, tcfg.long_max_turns) if kind == "long"
             else rng.randint(1, tcfg.max_turns))
    seqs: list[list[int]] = []
    masks: list[np.ndarray] = []
    longest = 0
    while len(seqs) < tcfg.max_batch:
        conv = step_conversation(tcfg, rng, kind, turns)
        ids, mask = encode_conversation(tok, conv, max_len)
        if len(seqs) >= tcfg.min_batch and (len(seqs) + 1) * max(longest, len(ids)) > tcfg.batch_tokens:
            break
        seqs.append(ids)
        masks.append(mask)
        longest = max(longest, len(ids))
    arr = np.full((len(seqs), longest), EOS_ID, dtype=np.int64)
    reply = np.zeros((len(seqs), longest), dtype=bool)
    valid = np.zeros((len(seqs), longest), dtype=bool)
    for i, (ids, mask) in enumerate(zip(seqs, masks, strict=True)):
        arr[i, : len(ids)] = ids
        reply[i, : len(ids)] = mask
        valid[i, : len(ids)] = True
    t = torch.from_numpy(arr)
    # input position p predicts token p + 1
    return t[:, :-1], t[:, 1:], torch.from_numpy(reply[:, 1:]), torch.from_numpy(valid[:, 1:])


def chat_loss(
    logits: torch.Tensor, targets: torch.Tensor, reply: torch.Tensor, valid: torch.Tensor, lm_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    nll = nll.view(targets.shape)
    r, other = reply.float(), (valid & ~reply).float()
    loss = (nll * r).sum() / r.sum() + lm_weight * (nll * other).sum() / other.sum().clamp(min=1)
    return loss, nll


# ---------------------------------------------------------------------------------------------
# training and evaluation


def warm_start(model: LlamaModel, vocab: Vocab, init_dir: Path, sha256: str) -> int:
    """Copy a chat checkpoint's weights into ``model``; embedding and output rows go by token text
    (tokens the old vocabulary lacks keep their fresh init). Returns how many tokens were carried."""
    npz = init_dir / f"{STEM}.npz"
    if sha256_file(npz) != sha256:
        raise ValueError(f"{npz} has sha256 {sha256_file(npz)}, the config asks for {sha256}")
    arrays, config = load_checkpoint(init_dir, STEM)
    index = {t: i for i, t in enumerate(vocab.tokens)}
    pairs = [(i, index[t]) for i, t in enumerate(config["vocab"]["tokens"]) if t in index]
    old, new = torch.tensor([i for i, _ in pairs]), torch.tensor([j for _, j in pairs])
    state = model.state_dict()
    with torch.no_grad():
        for name, arr in arrays.items():
            src = torch.from_numpy(arr)
            if name in ("token_embd.weight", "output.weight"):
                state[name][new] = src[old]
            else:
                state[name].copy_(src)
    return len(pairs)


def train(
    cfg: ModelConfig, tcfg: ChatTrainConfig, tok: ChatTokenizer, log_every: int = 50,
    stop_after: int | None = None, init_dir: Path | None = None, snapshot: Any = None,
) -> tuple[LlamaModel, list[dict[str, Any]]]:
    setup_torch(tcfg)  # type: ignore[arg-type]  # reads threads and seed only
    model = LlamaModel(cfg)
    if tcfg.init_sha256:
        if init_dir is None:
            raise ValueError("the config warm-starts from a checkpoint: give its folder (--init-dir)")
        print(json.dumps({"warm_start_tokens": warm_start(model, chat_vocab(), init_dir, tcfg.init_sha256)}))
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tcfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    log: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(tcfg.steps if stop_after is None else min(stop_after, tcfg.steps)):
        lr = lr_at(tcfg, step)  # type: ignore[arg-type]  # reads the schedule fields only
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, reply, valid = make_batch(tcfg, step, tok, cfg.context_length)
        logits = model(x)
        loss, nll = chat_loss(logits, y, reply, valid, tcfg.lm_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        opt.step()
        if step % log_every == 0 or step == tcfg.steps - 1:
            with torch.no_grad():
                other = valid & ~reply
                rec = {
                    "step": step,
                    "len": int(x.shape[1]) + 1,
                    "batch": int(x.shape[0]),
                    "loss": round(loss.item(), 4),
                    "reply_nll": round(float(nll[reply].mean()), 4),
                    "other_nll": round(float(nll[other].mean()), 4),
                    "reply_token_acc": round(float((logits.argmax(-1) == y)[reply].float().mean()), 4),
                    "lr": round(lr, 6),
                    "elapsed_s": round(time.perf_counter() - t0, 1),
                }
            log.append(rec)
            print(json.dumps(rec), flush=True)
        if snapshot is not None and step % 250 == 249:
            snapshot(model, step)
    model.eval()
    return model, log


@torch.no_grad()
def reply_accuracy(
    model: LlamaModel, tok: ChatTokenizer, conversations: Sequence[ct.Conversation]
) -> tuple[float, dict[str, float]]:
    model.eval()
    ok: dict[str, list[bool]] = {}
    for conv in conversations:
        ids, mask = encode_conversation(tok, conv, model.cfg.context_length)
        pred = model(torch.tensor([ids[:-1]])).argmax(-1)[0].numpy()
        hit = pred == np.asarray(ids[1:])
        starts = [p for p in range(1, len(ids)) if mask[p] and not mask[p - 1]]
        for fam, a in zip(conv.families, starts, strict=False):
            b = a
            while b < len(ids) and mask[b]:
                b += 1
            ok.setdefault(fam, []).append(bool(hit[a - 1 : b - 1].all()))
    every = [v for vs in ok.values() for v in vs]
    return sum(every) / len(every), {f: round(sum(v) / len(v), 4) for f, v in sorted(ok.items())}


EVAL_SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "heldout_200": ("conversation_set('heldout', 200, seed=7)", dict(split="heldout", count=200, seed=7)),
    "long_20": ("conversation_set('heldout-long', 20, seed=7, min_turns=12, max_turns=18)",
                dict(split="heldout-long", count=20, seed=7, min_turns=12, max_turns=18)),
    "recall_200": ("conversation_set('heldout-recall', 200, seed=7, kind='recall', made_up_p=0)",
                   dict(split="heldout-recall", count=200, seed=7, kind="recall", made_up_p=0.0)),
    "recall_far_100": ("conversation_set('heldout-recall-far', 100, seed=7, kind='recall', min_gap=5, "
                       "max_gap=10, made_up_p=0)",
                       dict(split="heldout-recall-far", count=100, seed=7, kind="recall", min_gap=5, max_gap=10,
                            made_up_p=0.0)),
    "recall_made_up_100": ("conversation_set('heldout-recall-made-up', 100, seed=7, kind='recall', made_up_p=1)",
                           dict(split="heldout-recall-made-up", count=100, seed=7, kind="recall", made_up_p=1.0)),
    "tools_100": ("conversation_set('heldout-tools', 100, seed=7, kind='tools')",
                  dict(split="heldout-tools", count=100, seed=7, kind="tools")),
}


OWN_HISTORY = ("heldout_200", "tools_100")  # the sets also run with the model's own replies as history


def eval_sets(smoke: bool = False) -> dict[str, list[ct.Conversation]]:
    out = {}
    for name, (_, kw) in EVAL_SETS.items():
        kw = dict(kw)
        if smoke:
            kw["count"] = min(int(kw["count"]), 20)  # type: ignore[call-overload]
        out[name] = ct.conversation_set(**kw)  # type: ignore[arg-type]
    return out


def llama_scores(gguf_path: Path, sets: dict[str, list[ct.Conversation]]) -> dict[str, Any] | None:
    try:
        from models.chat_eval import chat_accuracy
    except ImportError as e:  # llama-cpp-python is optional for training
        print(f"llama.cpp accuracy skipped: {e}", flush=True)
        return None
    out: dict[str, Any] = {}
    for name, convs in sets.items():
        for mode, own in (("reference_history", False), ("own_history", True))[: 2 if name in OWN_HISTORY else 1]:
            s = chat_accuracy(gguf_path, convs, own_history=own)
            out[f"{name}/{mode}"] = {"replies": s.replies, "exact": round(s.exact, 4), "eos": round(s.eos, 4),
                                     "by_family": {k: round(v, 4) for k, v in s.by_family.items()}}
            if not own:
                out[f"{name}/{mode}"]["first_misses"] = s.misses[:8]
    return out


def json_scores(gguf_path: Path, count: int) -> dict[str, Any] | None:
    try:
        from models.chat_eval import JSON_SCHEMAS, json_accuracy, json_questions
    except ImportError as e:
        print(f"llama.cpp JSON accuracy skipped: {e}", flush=True)
        return None
    out: dict[str, Any] = {"questions": f"json_questions({count})"}
    for name, schema in JSON_SCHEMAS.items():
        s = json_accuracy(gguf_path, json_questions(count), schema)
        out[name] = {"replies": s.replies, "parsed": round(s.parsed, 4), "eos": round(s.eos, 4),
                     "failures": s.failures[:4]}
    return out


def check_log(cfg: ModelConfig, tcfg: ChatTrainConfig, tok: ChatTokenizer, log_path: Path, n_steps: int,
              init_dir: Path | None) -> int:
    ref = {r["step"]: r for r in json.loads(log_path.read_text())}
    _, log = train(cfg, tcfg, tok, stop_after=n_steps, init_dir=init_dir)
    keys = ("len", "batch", "loss", "reply_nll", "other_nll", "reply_token_acc")
    diffs = [(r["step"], k, r[k], ref[r["step"]][k]) for r in log if r["step"] in ref for k in keys
             if r[k] != ref[r["step"]][k]]
    compared = sum(r["step"] in ref for r in log)
    print(json.dumps({"compared_records": compared, "differences": diffs}))
    return 1 if diffs or not compared else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(HERE), help="artifact folder (default: models/)")
    ap.add_argument("--steps", type=int, default=None, help="override ChatTrainConfig.steps")
    ap.add_argument("--smoke", action="store_true", help="tiny run (30 steps) for a quick check")
    ap.add_argument("--check-log", type=int, default=None, metavar="N",
                    help="train N steps and compare the log with <out-dir>/chat_train_log.json; writes nothing")
    ap.add_argument("--init-dir", default=None,
                    help="folder of the chat.npz + chat.json to warm-start from (ChatTrainConfig.init_sha256)")
    ap.add_argument("--snapshot-dir", default=None, help="write <dir>/step<N>.gguf every 250 steps (to evaluate early)")
    args = ap.parse_args(argv)

    tcfg = ChatTrainConfig(steps=30, warmup_steps=5, batch_tokens=1024) if args.smoke else ChatTrainConfig()
    if args.steps is not None:
        tcfg = ChatTrainConfig(**{**asdict(tcfg), "steps": args.steps})
    vocab = chat_vocab()
    cfg = chat_model_config(len(vocab))
    tok = ChatTokenizer.for_vocab(vocab)
    out = Path(args.out_dir)
    init_dir = Path(args.init_dir) if args.init_dir else None
    if args.check_log is not None:
        return check_log(cfg, tcfg, tok, out / f"{STEM}_train_log.json", args.check_log, init_dir)

    def config_of(tcfg: ChatTrainConfig) -> dict[str, Any]:
        return {
            "model": cfg.to_dict(),
            "vocab": {"tokens": list(vocab.tokens), "scores": list(vocab.scores), "types": list(vocab.types)},
            "bos_id": 1, "eos_id": EOS_ID, "unk_id": 0,
            "chat_template": CHAT_TEMPLATE,
            "train": asdict(tcfg),
        }

    def snapshot(model: LlamaModel, step: int) -> None:
        from models.chat_export import export_chat_gguf

        Path(args.snapshot_dir).mkdir(parents=True, exist_ok=True)
        export_chat_gguf(to_arrays(model), config_of(tcfg), Path(args.snapshot_dir) / f"step{step + 1}.gguf")

    t0 = time.perf_counter()
    model, log = train(cfg, tcfg, tok, init_dir=init_dir, snapshot=snapshot if args.snapshot_dir else None)
    train_s = time.perf_counter() - t0
    sets = eval_sets(args.smoke)
    torch_acc = {name: reply_accuracy(model, tok, convs) for name, convs in sets.items()}
    print(json.dumps({"torch_accuracy": torch_acc, "train_seconds": round(train_s, 1)}), flush=True)

    config = config_of(tcfg)
    arrays = to_arrays(model)
    npz, js = save_checkpoint(out, STEM, arrays, config)
    from models.chat_export import export_chat_gguf

    gguf_path = export_chat_gguf(arrays, config, out / f"{STEM}.gguf")
    llama = llama_scores(gguf_path, sets)
    print(json.dumps({"llama_cpp": llama}), flush=True)
    json_mode = json_scores(gguf_path, 10 if args.smoke else 50)
    print(json.dumps({"json_mode": json_mode}), flush=True)
    manifest = {
        "model": "kvres-chat: tiny Llama-architecture chat model trained by models/train_chat.py",
        "artifacts": {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in (npz, js, gguf_path)},
        "model_config": cfg.to_dict(),
        "train_config": asdict(tcfg),
        "vocab_size": len(vocab),
        "train_seconds": round(train_s, 1),
        "final_log": log[-1],
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "threads": tcfg.threads},
        "eval_sets": {k: spec for k, (spec, _) in EVAL_SETS.items()} if not args.smoke else "smoke",
        "accuracy": {
            "torch_teacher_forced": {k: {"exact": round(v[0], 4), "by_family": v[1]} for k, v in torch_acc.items()},
            "llama_cpp_greedy": llama,
            "llama_cpp_json_mode": json_mode,
        },
        "warm_start": {"npz_sha256": tcfg.init_sha256, "from": f"git show {BASE_COMMIT}:models/chat.npz (and chat.json)"}
        if tcfg.init_sha256 else None,
        "commands": {"train": "python models/train_chat.py --init-dir DIR  (DIR holds the warm start's chat.npz + chat.json)",
                     "export": "python models/chat_export.py"},
    }
    (out / "CHAT_MANIFEST.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    (out / f"{STEM}_train_log.json").write_text(json.dumps(log) + "\n")
    print(f"wrote {npz}, {js}, {gguf_path}, {out / 'CHAT_MANIFEST.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
