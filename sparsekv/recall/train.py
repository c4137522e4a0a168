"""Train a tiny recall model on the CPU: `python -m sparsekv train --task niah --preset recall`.

Recipe (Zoology's MQAR recipe, then our own changes):
  * architecture: the `recall` presets: a short causal conv (kernel 3), then attention with no
    positional encoding (NoPE); 2 heads sharing 1 kv head, width 128;
  * AdamW (lr 3e-3, weight decay 0.1), linear warm-up then cosine, batch 32, fresh data every
    step from the training seed stream;
  * a length curriculum: train at the first length until validation accuracy reaches
    `advance_at`, then sample uniformly from the lengths unlocked so far, up to the last one;
  * stop when validation accuracy at the longest training length reaches `target` (learning
    plateaus then jumps, so a step count is the wrong stopping rule), or at `max_minutes`.
Deterministic for a seed (single process; data from seeded generators). Writes, under --out:
model.safetensors, config.json, train_log.json (the curve), and prints a tqdm progress bar.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model.model import Model, ModelConfig
from . import tasks


@dataclass
class TrainConfig:
    task: str = "niah"
    preset: str = "recall"
    seed: int = 0
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 100
    max_steps: int = 6000                  # cosine horizon (training usually stops earlier)
    max_minutes: float = 20.0
    lengths: tuple = (64, 128, 256, 512, 1024)   # curriculum: short first (attention gradients ~ 1/length)
    advance_at: float = 0.9                # val accuracy that unlocks the next length
    target: float = 0.99                   # val accuracy at the longest length that stops training
    eval_every: int = 50
    eval_examples: int = 128
    task_kwargs: dict = field(default_factory=dict)
    eval_kwargs: dict = field(default_factory=dict)       # over task_kwargs for validation (e.g. all chains 2 hops)
    stages: tuple = ()                     # task-kwargs overrides trained in turn at lengths[0] (hops 1, then a mix)
    model_overrides: dict = field(default_factory=dict)   # ModelConfig fields over the preset's

    @classmethod
    def from_log(cls, config: dict) -> "TrainConfig":
        """The config recorded in a train_log.json (JSON lists back to tuples)."""
        return cls(**{**config, "lengths": tuple(config["lengths"]), "stages": tuple(config.get("stages", ()))})

    @property
    def validation_kwargs(self) -> dict:
        """Task kwargs of the final evaluation: the last stage's, with `eval_kwargs` on top."""
        last = self.stages[-1] if self.stages else {}
        return {**self.task_kwargs, **last, **self.eval_kwargs}

    def curriculum(self) -> list[tuple[int, dict, dict]]:
        """The steps of the curriculum, each (length, training kwargs, validation kwargs).

        First each stage in turn at lengths[0], then the last stage at each longer length. Training
        advances to the next step when validation accuracy reaches `advance_at`, and from then on
        samples uniformly from every step unlocked so far (so earlier stages stay in the mix).
        Earlier stages validate on their own task; the last one validates on `validation_kwargs`.
        """
        stages = list(self.stages) or [{}]
        steps = [(self.lengths[0], {**self.task_kwargs, **st}, {**self.task_kwargs, **st}) for st in stages[:-1]]
        last = {**self.task_kwargs, **stages[-1]}
        return steps + [(L, last, self.validation_kwargs) for L in self.lengths]


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * t))


@torch.no_grad()
def evaluate(model: Model, task: str, length: int, examples: int, batch: int = 32, **kw) -> float:
    """Teacher-forced answer accuracy on the eval seed stream (full-sequence forward)."""
    model.eval()
    right = total = 0
    for i in range(-(-examples // batch)):
        b = tasks.eval_batch(task, min(batch, examples - i * batch), length, index=i, **kw)
        logits = model.train_forward(b.tokens)
        mask = b.targets != -100
        right += int((logits.argmax(-1)[mask] == b.targets[mask]).sum())
        total += int(mask.sum())
    return right / total


def train(cfg: TrainConfig, out: Path | None = None, progress: bool = True) -> tuple[Model, dict]:
    from tqdm.auto import tqdm
    if cfg.task not in tasks.TASKS:
        raise ValueError(f"task must be one of {tasks.TASKS}, got {cfg.task!r}")
    torch.manual_seed(cfg.seed)
    model = Model(ModelConfig.from_name(cfg.preset, **cfg.model_overrides), seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    log = {"config": asdict(cfg), "model": model.config.as_dict(), "curve": []}
    plan = cfg.curriculum()
    for length, kw, val_kw in plan:              # bad task kwargs fail here, not minutes into training
        for k in (kw, val_kw):
            tasks.make_batch(cfg.task, 1, length, seed=0, **k)
    unlocked, t0 = 1, time.perf_counter()
    bar = tqdm(total=cfg.max_steps, desc=f"train {cfg.task}", disable=not progress)
    step = 0
    for step in range(cfg.max_steps):
        model.train()
        # training seeds: (seed, step) -> a stream disjoint from tasks.EVAL_SEED_OFFSET
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
        length, kw, _ = plan[int(torch.randint(0, unlocked, (1,), generator=gen))]
        seed = (cfg.seed * 100_003 + step) % tasks.EVAL_SEED_OFFSET
        b = tasks.make_batch(cfg.task, cfg.batch, length, seed=seed, **kw)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        logits = model.train_forward(b.tokens)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), b.targets.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.update(1)
        if step % cfg.eval_every == cfg.eval_every - 1:
            cur, _, val_kw = plan[unlocked - 1]
            acc = evaluate(model, cfg.task, cur, cfg.eval_examples, **val_kw)
            minutes = (time.perf_counter() - t0) / 60
            log["curve"].append({"step": step + 1, "loss": float(loss.detach()), "length": cur, "stage": unlocked - 1,
                                 "val_acc": acc, "minutes": minutes})
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", stage=unlocked - 1, len=cur, acc=f"{acc:.3f}")
            if acc >= cfg.advance_at and unlocked < len(plan):
                unlocked += 1
            elif unlocked == len(plan) and acc >= cfg.target:
                break
            if minutes > cfg.max_minutes:
                break
    bar.close()
    model.eval()
    log["steps"] = step + 1
    log["threads"] = torch.get_num_threads()
    log["minutes"] = (time.perf_counter() - t0) / 60
    log["final_val_acc"] = {L: evaluate(model, cfg.task, L, cfg.eval_examples * 2, **cfg.validation_kwargs)
                            for L in cfg.lengths}
    if out is not None:
        save(model, out, log)
    return model, log


def save(model: Model, out: Path, log: dict) -> None:
    from safetensors.torch import save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")                  # the same tensor as embed_tokens.weight
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(model.config.as_dict(), indent=1))
    (out / "train_log.json").write_text(json.dumps(log, indent=1))
    (out / "MODEL_CARD.md").write_text(model_card(model, log))


def model_card(model: Model, log: dict) -> str:
    """A short card: what the model is, how it was trained, how long, and how well (from `log`)."""
    c, t = model.config, log["config"]
    n = sum(p.numel() for p in model.parameters())
    accs = ", ".join(f"{k} tokens: {v:.3f}" for k, v in log["final_val_acc"].items())
    stages = t.get("stages") or []
    eval_kw = t.get("eval_kwargs") or {}
    stage_text = (f"; first the stages {stages} in turn at {t['lengths'][0]} tokens (each kept in the mix once passed)"
                  if stages else "")
    threads = f"--threads {log['threads']} " if log.get("threads") else ""   # float sums depend on the thread count

    def flag(name, value):
        return f" --{name} {json.dumps(value)!r}" if value else ""
    return (f"# {t['task']} ({t['preset']})\n\n"
            f"- Architecture: mixers {list(c.layer_mixers)}, width {c.dim}, {c.n_heads} query / {c.n_kv_heads} kv heads, "
            f"positions {c.positions!r}, vocabulary {c.vocab_size}; {n / 1e6:.2f}M parameters.\n"
            f"- Task: `{t['task']}` {t['task_kwargs'] or ''} (sparsekv.recall.tasks), answers scored after each query token"
            f"{f'; validated with {eval_kw} on top' if eval_kw else ''}.\n"
            f"- Recipe: AdamW lr {t['lr']} (weight decay {t['weight_decay']}), warm-up {t['warmup']} then cosine over "
            f"{t['max_steps']} steps, batch {t['batch']}, fresh data each step{stage_text}; length curriculum "
            f"{list(t['lengths'])} (advance at {t['advance_at']} validation accuracy); stop at {t['target']} or "
            f"{t['max_minutes']} minutes.\n"
            f"- Trained: {log['steps']} steps in {log['minutes']:.1f} minutes on this 2-core CPU (seed {t['seed']}).\n"
            f"- Dense validation accuracy (eval seed stream, {2 * t['eval_examples']} sequences): {accs}.\n"
            f"- Reproduce: `python -m sparsekv train --task {t['task']} --preset {t['preset']} --seed {t['seed']} "
            f"{threads}"
            f"--lengths {' '.join(map(str, t['lengths']))} --max-steps {t['max_steps']} "
            f"--max-minutes {t['max_minutes']}"
            f"{flag('task-kwargs', t['task_kwargs'])}{flag('stages', stages)}{flag('eval-kwargs', eval_kw)}"
            f"{flag('model-overrides', t.get('model_overrides'))} --out DIR`.\n")


def load_trained(path: str | Path) -> Model:
    """A model saved by `sparsekv.recall.train` (config.json + model.safetensors from this package)."""
    from safetensors.torch import load_file
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"path must be a folder written by sparsekv.recall.train; {path} has no config.json")
    cfg = json.loads((path / "config.json").read_text())
    cfg["mixers"] = tuple(cfg["mixers"])
    model = Model(ModelConfig(**cfg), seed=None)
    state = load_file(str(path / "model.safetensors"))
    if model.config.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=tasks.TASKS, required=True)
    ap.add_argument("--preset", default="recall")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--max-minutes", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--task-kwargs", type=json.loads, default={}, help='JSON, e.g. \'{"hops": 2}\'')
    ap.add_argument("--eval-kwargs", type=json.loads, default={}, help='JSON over --task-kwargs for validation')
    ap.add_argument("--stages", type=json.loads, default=[],
                    help='JSON list of task-kwargs overrides trained in turn first, e.g. \'[{"hops": 1}, {}]\'')
    ap.add_argument("--model-overrides", type=json.loads, default={}, help='JSON, e.g. \'{"n_heads": 4}\'')
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(task=args.task, preset=args.preset, seed=args.seed, lengths=tuple(args.lengths),
                      max_minutes=args.max_minutes, max_steps=args.max_steps, target=args.target, batch=args.batch,
                      lr=args.lr, task_kwargs=args.task_kwargs, eval_kwargs=args.eval_kwargs,
                      stages=tuple(args.stages), model_overrides=args.model_overrides)
    _, log = train(cfg, out=args.out)
    print(json.dumps({"steps": log["steps"], "minutes": round(log["minutes"], 2), "final_val_acc": log["final_val_acc"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
