"""LoRA fine-tune of the embedded SmolLM2-135M-Instruct on generated tool-use conversations (peft).

Seeded and resumable: the data are regenerated from the seed, the order is a seeded permutation, and
every `--save-every` steps the adapter, the optimizer, the scheduler and the loss history are saved
under `--out`; a rerun with the same arguments goes on from the last checkpoint. The loss is taken
on the target turn only, and the vocabulary projection runs only at those positions (on a CPU the
49k-wide head over the whole prompt would cost more than the rest of the backward pass).

    python -m train.lora --out train/out/run1 --examples 3000 --max-minutes 75
    python -m train.lora --out train/out/run1 --export train/adapters/smollm2_tools   # fp16 adapter

Works on CUDA with the same command (`--device cuda`; bf16 autocast there).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tokenize(rows: list[dict], tokenizer, max_len: int) -> list[tuple[list[int], list[bool]]]:
    """(ids, which ids are target tokens) per row; rows longer than max_len are cut at the end of
    their last target segment that fits, and dropped when none fits."""
    out = []
    for row in rows:
        ids: list[int] = []
        is_target: list[bool] = []
        kept = 0
        for text, target in row["segments"]:
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            is_target += [target] * len(piece)
            if target and len(ids) <= max_len:
                kept = len(ids)
        if kept:
            out.append((ids[:kept], is_target[:kept]))
    return out


def batches(data: list[tuple[list[int], int]], batch_size: int, seed: int) -> list[list[int]]:
    """A seeded order in batches of similar lengths (less padding), the batches themselves shuffled."""
    rng = random.Random(seed)
    order = list(range(len(data)))
    rng.shuffle(order)
    chunks = [order[i : i + batch_size * 16] for i in range(0, len(order), batch_size * 16)]
    out = []
    for chunk in chunks:
        chunk.sort(key=lambda i: len(data[i][0]))
        out += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(out)
    return out


def collate(data, idx: list[int], pad_id: int):
    seqs = [data[i] for i in idx]
    width = max(len(s[0]) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, (seq, is_target) in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, : len(seq)] = torch.where(torch.tensor(is_target), torch.tensor(seq), -100)
    return ids, mask, labels


def target_loss(model, ids, mask, labels) -> torch.Tensor:
    """Mean cross-entropy over target tokens, projecting to the vocabulary only where it counts."""
    base = model.get_base_model()
    hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, H)
    # position t predicts token t+1
    want = labels[:, 1:]
    pick = want != -100
    logits = base.lm_head(hidden[:, :-1][pick])  # (N, V)
    return torch.nn.functional.cross_entropy(logits.float(), want[pick])


def load(model_dir: str, args, device: str):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    config = LoraConfig(
        r=args.rank,
        lora_alpha=args.alpha,
        lora_dropout=args.dropout,
        target_modules=TARGETS,
        # the layers below run forward only (no graph): on a CPU that is most of the saving
        layers_to_transform=list(range(args.layers_from, model.config.num_hidden_layers)),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def load_adapter(model, folder: Path) -> None:
    """Load an adapter's weights (a checkpoint's or an exported float16 one) into the fresh peft model;
    one of another rank or layer range is refused."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise SystemExit(f"{folder} does not fit this model (rank or layers differ): {missing[:2]}")


def plot(losses: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(losses) + 1), losses, lw=0.6, alpha=0.5, label="step")
    k = max(1, len(losses) // 25)
    smooth = [
        sum(losses[max(0, i - k) : i + 1]) / len(losses[max(0, i - k) : i + 1]) for i in range(len(losses))
    ]
    ax.plot(range(1, len(losses) + 1), smooth, lw=1.5, label=f"mean of {k + 1}")
    ax.set(xlabel="optimizer step", ylabel="target-token loss", title="SmolLM2-135M tool-use LoRA")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(out: Path, model, opt, sched, state: dict) -> None:
    ckpt = out / "checkpoint"
    tmp = out / "checkpoint.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    if ckpt.exists():
        import shutil

        shutil.rmtree(ckpt)
    tmp.rename(ckpt)
    plot(state["losses"], out / "loss.png")


def export(out: Path, dest: Path) -> None:
    """The last checkpoint's adapter in float16 safetensors (what the repository ships)."""
    from safetensors.torch import load_file, save_file

    ckpt = out / "checkpoint"
    tensors = load_file(str(ckpt / "adapter_model.safetensors"))
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in tensors.items()}, str(dest / "adapter_model.safetensors"))
    (dest / "adapter_config.json").write_text((ckpt / "adapter_config.json").read_text())
    state = json.loads((ckpt / "state.json").read_text())
    recipe = {k: v for k, v in state.items() if k != "losses"}
    recipe["final_loss_mean_last_20"] = sum(state["losses"][-20:]) / max(1, len(state["losses"][-20:]))
    (dest / "recipe.json").write_text(json.dumps(recipe, indent=1))
    print(f"exported {dest}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="train/out/run")
    ap.add_argument("--model", default=None, help="float checkpoint folder (default: the embedded model's)")
    ap.add_argument("--examples", type=int, default=3000)
    ap.add_argument("--data", default=None, help="rows of `train.generate` (jsonl), not generated here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the epochs')")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--layers-from", type=int, default=18, help="adapt layers from this index up")
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast (slower on CPUs with avx512_bf16)")
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument(
        "--max-minutes", type=float, default=0, help="save and stop after this long (0: no limit)"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--export", default=None, help="write the last checkpoint's fp16 adapter here and exit")
    ap.add_argument(
        "--init-adapter",
        default=None,
        help="start from this adapter's weights (a second pass; same --rank and --layers-from)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.export:
        export(out, Path(args.export))
        return {}
    from tqdm import tqdm
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.model is None:
        from train.generate import base_model_dir

        args.model = base_model_dir()
    model_dir = args.model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if args.data:  # pre-rendered rows (a machine without the app's packages can train on them)
        rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    else:
        from train.generate import Generator, PromptRenderer

        rows = list(Generator(args.seed).samples(PromptRenderer(tokenizer), args.examples))
    data = tokenize(rows, tokenizer, args.max_len)
    per_epoch = batches(data, args.batch_size, args.seed)
    total = args.max_steps or math.ceil(len(per_epoch) * args.epochs)
    schedule = [
        b
        for e in range(math.ceil(total / len(per_epoch)))
        for b in batches(data, args.batch_size, args.seed + e)
    ]
    model = load(model_dir, args, args.device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, total - args.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    state = {"step": 0, "losses": [], "tokens": 0, "target_tokens": 0, "seconds": 0.0,
             "examples": len(data), "total_steps": total, "args": vars(args)}  # fmt: skip
    ckpt = out / "checkpoint"
    if (ckpt / "state.json").exists():
        load_adapter(model, ckpt)
        saved = torch.load(ckpt / "optim.pt", weights_only=True)
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        state = json.loads((ckpt / "state.json").read_text())
        print(f"resumed from step {state['step']}")
    elif args.init_adapter:
        load_adapter(model, Path(args.init_adapter))
        print(f"started from {args.init_adapter}")
    out.mkdir(parents=True, exist_ok=True)
    model.train()
    started = time.monotonic()
    seconds0 = state["seconds"]
    bar = tqdm(total=total, initial=state["step"], desc="lora", unit="step", dynamic_ncols=True)
    # bf16 matmuls (fp32 master weights): twice the fp32 rate on the 2-core EPYC (avx512_bf16)
    amp = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=not args.fp32)
    while state["step"] < total:
        ids, mask, labels = collate(data, schedule[state["step"]], tokenizer.pad_token_id or 0)
        ids, mask, labels = ids.to(args.device), mask.to(args.device), labels.to(args.device)
        with amp:
            loss = target_loss(model, ids, mask, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["losses"].append(round(loss.item(), 5))
        state["tokens"] += int(mask.sum())
        state["target_tokens"] += int((labels != -100).sum())
        state["seconds"] = round(seconds0 + time.monotonic() - started, 1)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok=state["tokens"])
        out_of_time = args.max_minutes and time.monotonic() - started > args.max_minutes * 60
        if state["step"] % args.save_every == 0 or state["step"] == total or out_of_time:
            save(out, model, opt, sched, state)
        if out_of_time:
            print(f"\nstopped at step {state['step']} (time limit); rerun to resume")
            break
    bar.close()
    return state


if __name__ == "__main__":
    main()
