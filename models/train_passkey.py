"""Train the project's own passkey-retrieval model (torch, CPU) and write its artifacts.

Primitives:
- ``TrainConfig``: steps, batch, learning-rate schedule, length curriculum, task mix, seeds.
- ``LlamaModel(cfg)``: a Llama-architecture decoder (RMSNorm, RoPE in llama.cpp's NORM
  adjacent-pair layout, grouped KV heads, SwiGLU, untied output), so its GGUF export is exact.
- ``seq_len_at`` / ``needles_at``: the curricula (length held at 64 for the first 10% of the
  steps, then 64 -> 400 by 30%; family-2 needles 1 -> 6 by 50%).
- ``sample_sequence`` / ``make_batch(tcfg, step) -> (inputs, targets, answer_mask)``: the step's
  synthetic batch, a pure function of the seed and the step (35% family 1 single passkey, 65%
  family 2 key/value needles). A family-2 training sequence asks up to 3 of its needles in turn
  ("... is 48213 . what is the pass key of bob ? ..."): without the needle curriculum and these
  extra questions, family 2 stayed at 0% (the model mixed digits of several needles) while
  family 1 reached 99.5%.
- ``passkey_loss(logits, targets, answer_mask, lm_weight)``: mean NLL of the answer tokens plus
  ``lm_weight`` times the mean NLL of all other tokens. Weighting the answer as a fixed share of the
  loss (not per token) matters: with per-token weights (answer x4) the answer was ~8% of a
  300-token sequence's loss and the copy circuit had not formed after 500 steps.
- ``train(cfg, tcfg) -> (model, log)`` and ``passkey_accuracy(model, tasks) -> float``
  (exact match of all answer digits, greedy; teacher-forced argmax is the same thing).
- ``to_arrays(model)``: float32 arrays under GGUF tensor names (see ``models.checkpoint``).
- CLI: ``python models/train_passkey.py`` trains, saves ``models/passkey.{npz,json}``, exports
  ``models/passkey.gguf``, measures accuracy in torch and (if llama-cpp-python is installed) in
  llama.cpp, and writes ``models/MANIFEST.json``. ``--smoke`` runs a tiny version into a
  scratch folder; ``--check-log N`` re-trains the first N steps and compares them with the
  committed ``passkey_train_log.json`` (a cheap reproducibility check; writes nothing).

Deterministic: fixed seeds, ``torch.set_num_threads(2)``, deterministic algorithms, batches derived
from (seed, step) only. On one machine a re-run is bit-identical (two --smoke runs gave the same
checkpoint bytes; --check-log 251 matched the committed log exactly); other CPUs may round
differently, so there the claim is the accuracy, not the bytes.

Committed run (2,000 steps, 2 threads of a shared 2-core machine): 648 s wall, ~1,080 s CPU;
full-cache exact match at 200-394 tokens, torch = llama.cpp: family 1 100% (200 prompts),
family 2 92% (200 prompts, 2-6 needles). See MANIFEST.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make "models" importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch import nn

from models import passkey_tasks as pt
from models.checkpoint import ModelConfig, save_checkpoint, sha256_file, tensor_names

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_tokens: int = 4096  # batch size = clamp(batch_tokens // length, min_batch, max_batch)
    min_batch: int = 8
    max_batch: int = 64
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    min_len: int = 64  # training sequence length (prompt + answer + EOS) at the start
    max_len: int = 400  # ... and after the curriculum
    hold_frac: float = 0.1  # lengths stay at min_len for this fraction of the steps (copy circuit forms)
    curriculum_frac: float = 0.3  # ... then the max length ramps min_len -> max_len until this fraction
    multi_frac: float = 0.65  # share of family-2 (several key/value needles) samples
    min_needles: int = 1  # family 2 draws min_needles..k needles; k ramps min -> max_needles ...
    max_needles: int = 6
    needle_ramp_frac: float = 0.5  # ... from the end of the hold to this fraction of the steps
    train_questions: int = 3  # family 2 training sequences ask up to this many needles in turn
    n_digits: int = pt.DEFAULT_DIGITS
    lm_weight: float = 0.25  # loss = mean NLL of the answer (digits + EOS) + lm_weight * mean NLL of the rest
    seed: int = 1234  # torch init
    data_seed: int = 4321  # batches
    threads: int = 2


# ---------------------------------------------------------------------------------------------
# model


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: ModelConfig, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (n, head_dim/2): pair i rotates by pos * base^(-2i/head_dim)."""
    inv = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """llama.cpp NORM layout: rotate adjacent pairs (x[2i], x[2i+1]). x: (B, H, T, D)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
        self.cfg = cfg
        self.attn_norm = RMSNorm(d, cfg.rms_eps)
        self.attn_q = nn.Linear(d, d, bias=False)
        self.attn_k = nn.Linear(d, kv, bias=False)
        self.attn_v = nn.Linear(d, kv, bias=False)
        self.attn_output = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.rms_eps)
        self.ffn_gate = nn.Linear(d, cfg.d_ff, bias=False)
        self.ffn_up = nn.Linear(d, cfg.d_ff, bias=False)
        self.ffn_down = nn.Linear(cfg.d_ff, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.attn_q(h).view(b, t, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.attn_k(h).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.attn_v(h).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # query head j reads KV head j // group, as llama.cpp's broadcast does
        group = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_output(a.transpose(1, 2).reshape(b, t, c.d_model))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token_embd = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blk = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.output_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, cfg.context_length)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * cfg.n_layers)
                    if name.endswith(("attn_output.weight", "ffn_down.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.cfg.context_length:
            raise ValueError(f"sequence of {t} tokens exceeds context_length {self.cfg.context_length}")
        x = self.token_embd(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blk:
            x = blk(x, cos, sin)
        return self.output(self.output_norm(x))


def to_arrays(model: LlamaModel) -> dict[str, np.ndarray]:
    """Parameters as float32 numpy arrays under their GGUF tensor names."""
    sd = {k: v.detach().cpu().float().numpy().copy() for k, v in model.state_dict().items()}
    out = {}
    for name in tensor_names(model.cfg):
        out[name] = sd[name]
    return out


# ---------------------------------------------------------------------------------------------
# data


def seq_len_at(tcfg: TrainConfig, step: int, rng: random.Random) -> int:
    """Curriculum: min_len for the first hold_frac of the steps, then the max length ramps
    linearly to max_len at curriculum_frac; lengths are drawn in [max/2, max]."""
    hold = int(tcfg.hold_frac * tcfg.steps)
    ramp = max(1, int(tcfg.curriculum_frac * tcfg.steps) - hold)
    cur_max = tcfg.min_len + (tcfg.max_len - tcfg.min_len) * min(1.0, max(0, step - hold) / ramp)
    lo = max(tcfg.min_len, int(cur_max) // 2)
    return rng.randint(lo, max(lo, int(cur_max)))


def needles_at(tcfg: TrainConfig, step: int) -> int:
    """Needle curriculum: the most family-2 needles in a prompt at this step (min -> max_needles).
    With needle_ramp_frac <= hold_frac there is no ramp (max_needles from the start)."""
    hold = int(tcfg.hold_frac * tcfg.steps)
    end = int(tcfg.needle_ramp_frac * tcfg.steps)
    if end <= hold:
        return tcfg.max_needles
    frac = min(1.0, max(0, step - hold) / (end - hold))
    return tcfg.min_needles + round((tcfg.max_needles - tcfg.min_needles) * frac)


_MULTI_Q = 14  # tokens of a family-2 question: "what is the pass key of X ? the pass key of X is"


def sample_sequence(
    tcfg: TrainConfig, rng: random.Random, seq_len: int, max_needles: int
) -> tuple[list[int], np.ndarray]:
    """One training sequence of exactly ``seq_len`` tokens and its answer-target mask.

    Family 2 sequences carry up to ``train_questions`` question/answer pairs (each about a
    different needle, separated by "."), which multiplies the retrieval signal per sequence; the
    prompt up to the first answer is exactly a ``make_multi_task`` prompt.
    """
    d = tcfg.n_digits
    if rng.random() < tcfg.multi_frac:
        # fit the needles: BOS + k*(7+digits) + question + some filler
        budget = seq_len - d - 1
        fit = (budget - 1 - _MULTI_Q - 8) // (7 + d)
        k = rng.randint(tcfg.min_needles, max(tcfg.min_needles, min(max_needles, fit)))
        n_q = 1
        if tcfg.train_questions > 1:
            n_q = rng.randint(1, min(k, tcfg.train_questions))
            # shrink to what fits: each extra pair costs question + digits + "."
            while n_q > 1 and budget - (n_q - 1) * (_MULTI_Q + d + 1) < 1 + k * (7 + d) + _MULTI_Q + 8:
                n_q -= 1
        n_prompt = budget - (n_q - 1) * (_MULTI_Q + d + 1)
        task = pt.make_multi_task(rng, n_prompt, n_needles=k, n_digits=d)
        ids = task.prompt_ids + task.answer_ids
        answer_pos = list(range(task.n_tokens, len(ids)))
        others = [i for i in range(k) if i != task.target]
        for j in rng.sample(others, n_q - 1):
            ids.append(pt.TOKEN_TO_ID["."])
            answer_pos.append(len(ids) - 1)
            name = task.keys[j]
            ids.extend(pt.encode(f"what is the pass key of {name} ? the pass key of {name} is"))
            a, b = task.needle_spans[j]
            digits = task.prompt_ids[b - 1 - d : b - 1]
            answer_pos.extend(range(len(ids), len(ids) + d))
            ids.extend(digits)
    else:
        task = pt.make_single_task(rng, seq_len - d - 1, n_digits=d)
        ids = task.prompt_ids + task.answer_ids
        answer_pos = list(range(task.n_tokens, len(ids)))
    ids.append(pt.EOS_ID)
    answer_pos.append(len(ids) - 1)
    if len(ids) != seq_len:
        raise AssertionError(f"training sequence of {len(ids)} tokens, expected {seq_len}")
    mask = np.zeros(seq_len - 1, dtype=bool)
    mask[np.asarray(answer_pos) - 1] = True  # input position p predicts token p + 1
    return ids, mask


def make_batch(tcfg: TrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = random.Random(f"train/{tcfg.data_seed}/{step}")
    seq_len = seq_len_at(tcfg, step, rng)
    seqs, masks = [], []
    batch = max(tcfg.min_batch, min(tcfg.max_batch, tcfg.batch_tokens // seq_len))
    for _ in range(batch):
        ids, m = sample_sequence(tcfg, rng, seq_len, needles_at(tcfg, step))
        seqs.append(ids)
        masks.append(m)
    arr = torch.tensor(seqs, dtype=torch.long)
    return arr[:, :-1], arr[:, 1:], torch.from_numpy(np.stack(masks))


def passkey_loss(
    logits: torch.Tensor, targets: torch.Tensor, answer: torch.Tensor, lm_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-token NLL): answer mean NLL + lm_weight * mean NLL of the other tokens."""
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    nll = nll.view(targets.shape)
    ans = answer.float()
    loss = (nll * ans).sum() / ans.sum() + lm_weight * (nll * (1 - ans)).sum() / (1 - ans).sum()
    return loss, nll


# ---------------------------------------------------------------------------------------------
# training and evaluation


def lr_at(tcfg: TrainConfig, step: int) -> float:
    if step < tcfg.warmup_steps:
        return tcfg.lr * (step + 1) / tcfg.warmup_steps
    p = (step - tcfg.warmup_steps) / max(1, tcfg.steps - tcfg.warmup_steps)
    return tcfg.lr * (tcfg.min_lr_frac + (1 - tcfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def setup_torch(tcfg: TrainConfig) -> None:
    torch.set_num_threads(tcfg.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(tcfg.seed)
    np.random.seed(tcfg.seed)
    random.seed(tcfg.seed)


def train(
    cfg: ModelConfig, tcfg: TrainConfig, log_every: int = 50, stop_after: int | None = None
) -> tuple[LlamaModel, list[dict]]:
    """Train from scratch; ``stop_after`` ends early with the schedule unchanged (for checks)."""
    setup_torch(tcfg)
    model = LlamaModel(cfg)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tcfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    log: list[dict] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(tcfg.steps if stop_after is None else min(stop_after, tcfg.steps)):
        for g in opt.param_groups:
            g["lr"] = lr_at(tcfg, step)
        x, y, ans = make_batch(tcfg, step)
        logits = model(x)
        loss, nll = passkey_loss(logits, y, ans, tcfg.lm_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        opt.step()
        if step % log_every == 0 or step == tcfg.steps - 1:
            with torch.no_grad():
                ans_nll = float(nll[ans].mean())
                lm_nll = float(nll[~ans].mean())
                ans_acc = float((logits.argmax(-1) == y)[ans].float().mean())
            rec = {
                "step": step,
                "len": int(x.shape[1]) + 1,
                "batch": int(x.shape[0]),
                "loss": round(loss.item(), 4),
                "lm_nll": round(lm_nll, 4),
                "answer_nll": round(ans_nll, 4),
                "answer_token_acc": round(ans_acc, 4),
                "lr": round(lr_at(tcfg, step), 6),
                "elapsed_s": round(time.perf_counter() - t0, 1),
            }
            log.append(rec)
            print(json.dumps(rec), flush=True)
    model.eval()
    return model, log


@torch.no_grad()
def passkey_accuracy(model: LlamaModel, tasks: list[pt.PasskeyTask], batch_size: int = 16) -> float:
    """Exact match of every answer digit under greedy decoding (equal to teacher-forced argmax)."""
    model.eval()
    correct = 0
    for i in range(0, len(tasks), batch_size):
        chunk = tasks[i : i + batch_size]
        seqs = [t.prompt_ids + t.answer_ids[:-1] for t in chunk]
        n = max(len(s) for s in seqs)
        x = torch.tensor([s + [pt.EOS_ID] * (n - len(s)) for s in seqs], dtype=torch.long)
        pred = model(x).argmax(-1)
        for j, t in enumerate(chunk):
            a0 = t.n_tokens - 1
            got = pred[j, a0 : a0 + len(t.answer_ids)].tolist()
            correct += got == t.answer_ids
    return correct / len(tasks)


def eval_sets(n_digits: int, max_len: int, count: int = 200) -> dict[str, list[pt.PasskeyTask]]:
    """The fixed evaluation sets recorded in the manifest (prompts at training length)."""
    lo, hi = max_len // 2, max_len - n_digits - 1
    k_hi = max(2, min(6, (lo - 1 - 14 - 8) // (7 + n_digits)))
    return {
        "family1": pt.fixed_task_set(1, count, seed=7, n_tokens=(lo, hi), n_digits=n_digits),
        "family1_middle_third_50": pt.fixed_task_set(
            1, 50, seed=0, n_tokens=(lo, hi), depth=(1 / 3, 2 / 3), n_digits=n_digits
        ),
        "family2": pt.fixed_task_set(
            2, count, seed=7, n_tokens=(lo, hi), n_needles=(2, k_hi), n_digits=n_digits
        ),
    }


EVAL_SET_SPECS = {
    "family1": "fixed_task_set(1, 200, seed=7, n_tokens=(200, 394))",
    "family1_middle_third_50": "fixed_task_set(1, 50, seed=0, n_tokens=(200, 394), depth=(1/3, 2/3))",
    "family2": "fixed_task_set(2, 200, seed=7, n_tokens=(200, 394), n_needles=(2, 6))",
}


def llama_accuracies(gguf_path: Path, sets: dict[str, list[pt.PasskeyTask]]) -> dict[str, float] | None:
    try:
        from models.llama_eval import llama_passkey_accuracy
    except ImportError as e:  # llama-cpp-python is optional for training
        print(f"llama.cpp accuracy skipped: {e}", flush=True)
        return None
    return {name: llama_passkey_accuracy(gguf_path, tasks) for name, tasks in sets.items()}


def check_log(cfg: ModelConfig, tcfg: TrainConfig, log_path: Path, n_steps: int) -> int:
    """Re-train the first ``n_steps`` and compare the logged records with the committed log."""
    ref = {r["step"]: r for r in json.loads(log_path.read_text())}
    _, log = train(cfg, tcfg, stop_after=n_steps)
    keys = ("len", "batch", "loss", "lm_nll", "answer_nll", "answer_token_acc")
    diffs = [
        (r["step"], k, r[k], ref[r["step"]][k])
        for r in log
        if r["step"] in ref
        for k in keys
        if r[k] != ref[r["step"]][k]
    ]
    compared = sum(r["step"] in ref for r in log)
    print(json.dumps({"compared_records": compared, "differences": diffs}))
    return 1 if diffs or not compared else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(HERE), help="artifact folder (default: models/)")
    ap.add_argument("--stem", default="passkey")
    ap.add_argument("--steps", type=int, default=None, help="override TrainConfig.steps")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny run (40 steps, short prompts) for a quick check"
    )
    ap.add_argument(
        "--check-log",
        type=int,
        default=None,
        metavar="N",
        help="reproducibility check: train N steps of the full schedule and compare the log with "
        "<out-dir>/<stem>_train_log.json; writes nothing",
    )
    args = ap.parse_args(argv)

    tcfg = TrainConfig()
    if args.smoke:
        tcfg = TrainConfig(steps=40, batch_tokens=512, max_len=128, warmup_steps=5)
    if args.steps is not None:
        tcfg = TrainConfig(**{**asdict(tcfg), "steps": args.steps})
    cfg = ModelConfig(vocab_size=len(pt.VOCAB))
    out = Path(args.out_dir)

    t0 = time.perf_counter()
    if args.check_log is not None:
        return check_log(cfg, tcfg, out / f"{args.stem}_train_log.json", args.check_log)

    model, log = train(cfg, tcfg)
    train_s = time.perf_counter() - t0

    sets = eval_sets(tcfg.n_digits, tcfg.max_len, count=40 if args.smoke else 200)
    torch_acc = {name: passkey_accuracy(model, tasks) for name, tasks in sets.items()}
    print(json.dumps({"torch_accuracy": torch_acc, "train_seconds": round(train_s, 1)}), flush=True)

    config = {
        "model": cfg.to_dict(),
        "vocab": list(pt.VOCAB),
        "bos_id": pt.BOS_ID,
        "eos_id": pt.EOS_ID,
        "unk_id": pt.UNK_ID,
        "train": asdict(tcfg),
    }
    npz, js = save_checkpoint(out, args.stem, to_arrays(model), config)

    from models.export_gguf import export_gguf

    gguf_path = export_gguf(to_arrays(model), config, out / f"{args.stem}.gguf")
    llama_acc = llama_accuracies(gguf_path, sets)
    print(json.dumps({"llama_cpp_accuracy": llama_acc}), flush=True)

    manifest = {
        "model": "kvres-passkey: Llama-architecture retrieval model trained by models/train_passkey.py",
        "artifacts": {
            p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in (npz, js, gguf_path)
        },
        "model_config": cfg.to_dict(),
        "train_config": asdict(tcfg),
        "vocab_size": len(pt.VOCAB),
        "train_seconds": round(train_s, 1),
        "final_log": log[-1],
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": tcfg.threads,
        },
        "eval_sets": {k: v for k, v in EVAL_SET_SPECS.items()} if not args.smoke else "smoke",
        "accuracy": {"torch_full_cache": torch_acc, "llama_cpp_full_cache": llama_acc},
        "commands": {
            "train": "python models/train_passkey.py",
            "export": "python models/export_gguf.py",
        },
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / f"{args.stem}_train_log.json").write_text(json.dumps(log) + "\n")
    print(f"wrote {npz}, {js}, {gguf_path}, {out / 'MANIFEST.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
