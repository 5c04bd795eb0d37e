"""Train the shipped demo model: a tiny Qwen3-VL that answers questions about drawn shapes.

Runs in a separate venv with torch and transformers (never Merlin dependencies); Merlin's
own package (for the scene drawer, the preprocessing and the final check) is imported from
the source tree next to this script:

    python -m venv /work/venvs/torch
    /work/venvs/torch/bin/pip install torch==2.13.0 transformers safetensors numpy pillow \
        tokenizers jinja2 platformdirs numba
    /work/venvs/torch/bin/python scripts/train_demo.py --steps 3000           # -> a build folder
    /work/venvs/torch/bin/python scripts/train_demo.py --steps 3000 --install --force

What it does, in order:
1. the side files (tokenizer trained with `tokenizers` on the question/answer text, config.json
   in the published 4.57 spelling, the real Qwen3-VL Instruct chat template, generation and
   preprocessor configs) from `merlin.engine.demo_model`;
2. a Qwen3VLForConditionalGeneration from that config.json, trained from scratch with AdamW
   on conversations drawn on the fly (`engine.demo_scenes`: a picture, then one to three
   questions and answers; a few text-only turns; some with a system prompt). The loss is on
   the answer tokens and their <|im_end|>, plus (--aux-weight, off by default) a
   training-only probe that reads each merged image token and predicts the kind, colour,
   place and size of the shape under it (token_targets); the probe is not saved; and
   (--attend-weight, off by default) an attention target: head 0 of two decoder layers is
   taught to look at the shape a colour/where/bigger question names, and at each shape in
   turn while a list or description names it (attend_targets). With
   --tower-minutes a phase before it trains the vision tower and that probe alone on pictures
   (_tower_phase), so the tower learns to tell the kinds apart before the answers. Prompt ids
   are made exactly as Merlin makes them: the chat template rendered by Merlin's tokenizer,
   image pads expanded to the grid;
3. bf16 safetensors via save_pretrained, config.json rewritten in the 4.57 spelling, a README
   and train_log.json (seed, recipe, loss curve, wall time);
4. the check: transformers reloads the folder and Merlin loads it; on held-out scenes both
   must give the same greedy answer, and the exact-answer accuracy is printed. Only then is
   the folder moved into place. The shipped checkpoint is never replaced without --force.

Everything is seeded (torch, the scene seeds); torch runs on --threads threads. A rerun with
the same versions and thread count gives the same loss curve up to float summation order.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


from merlin.engine import demo_model as dm  # noqa: E402
from merlin.engine import demo_scenes as ds  # noqa: E402
from merlin.engine.tokenizer import Tokenizer  # noqa: E402
from merlin.engine.vision.preprocess import parse_preprocess_config, prepare_pil  # noqa: E402

SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "你是一个有用的助手。"]


def make_conversation(
    rng: random.Random, index: int, favour: tuple[str, ...] = ()
) -> tuple[str | None, list[dict]]:
    """(image seed or None, turns): turns are {"q": text, "a": answer}. The question kinds
    in `favour` are asked twice as often as the others (none: all alike)."""
    if rng.random() < 0.07:
        turns = []
        for _ in range(rng.choice([1, 1, 2])):
            text, lang = ds.text_only_prompt(rng)
            turns.append({"q": text, "a": ds.TEXT_ONLY_ANSWER[lang]})
        return None, turns
    seed = index
    sc = ds.scene(seed)
    lang = rng.choice(ds.LANGS)
    turns = []
    kinds = [k for k in ds.QUESTION_KINDS if ds.can_ask(sc, k)]
    for _ in range(rng.choice([1, 2, 2, 3, 3])):
        if rng.random() < 0.2:
            lang = rng.choice(ds.LANGS)
        if favour:
            kind = rng.choices(kinds, [2 if k in favour else 1 for k in kinds])[0]
        else:
            kind = rng.choice(kinds)
        q = ds.question(sc, kind, lang, rng.randrange(10**9))
        turns.append({"q": q.text, "a": q.answer, "kind": kind, "named": q.named, "lang": lang})
    return seed, turns


# Question kinds whose answer is an attribute looked up by the shape kind the question names
# (attend_targets): colour, place, and the size comparison of two named shapes. The list
# kinds (ds.LIST_KINDS: shapes, describe) get a target per shape named in the answer.
LOOKUP_KINDS = ("colour", "where", "bigger")


class Encoder:
    """Conversation -> (input_ids, labels, pixel_values, grid, probe targets, attention
    targets) as Merlin builds prompts; the last two are None without a picture."""

    def __init__(self, folder: Path):
        self.tok = Tokenizer.from_folder(folder)
        self.pre = parse_preprocess_config(dm.PREPROCESSOR, folder / "preprocessor_config.json")
        self.pad = self.tok.token_id("<|image_pad|>")
        self.im_end = self.tok.token_id("<|im_end|>")

    def encode(self, image_seed, turns, system=None):
        messages = [{"role": "system", "content": system}] if system else []
        pixels = grid = None
        n_pad = 0
        aux = owner = sc = None
        if image_seed is not None:
            sc = ds.scene(image_seed)
            image, label_map = ds.draw(sc, labels=True)
            prepared = prepare_pil(image, self.pre)
            pixels, grid = prepared.pixel_values, prepared.grid_thw
            n_pad = grid[0] * grid[1] * grid[2] // 4
            owner = token_owners(sc, label_map, grid)
            aux = token_targets(sc, owner)
        ids: list[int] = []
        labels: list[int] = []
        spans = []  # (first answer index, end, turn, character ends) before the pad is expanded
        for t, turn in enumerate(turns):
            content = turn["q"]
            if t == 0 and image_seed is not None:
                content = [{"type": "image"}, {"type": "text", "text": turn["q"]}]
            messages.append({"role": "user", "content": content})
            prompt = self.tok.encode_chat(messages, add_generation_prompt=True)
            new = prompt[len(ids) :]
            assert prompt[: len(ids)] == ids, "the template re-rendered an earlier turn"
            ids += new
            labels += [-100] * len(new)
            answer = self.tok.encode_text(turn["a"]) + [self.im_end]
            ends = [len(self.tok.decode(answer[: j + 1])) for j in range(len(answer) - 1)]
            spans.append((len(ids), len(ids) + len(answer), turn, ends))
            ids += answer
            labels += answer
            messages.append({"role": "assistant", "content": turn["a"]})
            full = self.tok.encode_chat(messages, add_generation_prompt=False)
            assert full[: len(ids)] == ids, "answer tokens differ from the template's"
            ids += full[len(ids) :]  # the "\n" after <|im_end|>
            labels += [-100] * (len(full) - len(labels))
        attend = None
        if n_pad:
            at = ids.index(self.pad)
            ids = ids[:at] + [self.pad] * n_pad + ids[at + 1 :]
            labels = labels[:at] + [-100] * n_pad + labels[at + 1 :]
            attend = attend_targets(sc, owner, spans, at, n_pad - 1)
        return ids, labels, pixels, grid, aux, attend


def attend_targets(sc, owner, spans, image_at: int, shift: int) -> list[tuple[int, int, list]]:
    """(first query position, end, key positions): where one attention head is taught to
    look (a training-only target, --attend-weight), as positions after the pad's expansion.

    - Answers to lookup questions (LOOKUP_KINDS) about shapes that are there: the positions
      that predict the answer's tokens look at the image tokens of the shapes the question
      names (token_owners).
    - Answers that list every shape (ds.LIST_KINDS): the positions that predict the words
      naming one shape (ds.part_spans) look at that shape's image tokens, so the list is read
      shape by shape instead of from a blend of all of them.

    `spans`: (first answer index, end, turn, the answer tokens' character ends) before the
    pad's expansion; the answer's last token (<|im_end|>) has no characters."""
    import numpy as np

    def keys_of(shapes):
        return (np.flatnonzero(np.isin(owner, [i + 1 for i in shapes])) + image_at).tolist()

    out = []
    for start, end, turn, ends in spans:
        kind = turn.get("kind")
        if kind in LOOKUP_KINDS:
            present = [i for i, s in enumerate(sc.shapes) if s.kind in turn["named"]]
            if len(present) != len(turn["named"]):
                continue  # "there is no star": nothing to look at
            # the positions whose next token is an answer token
            out.append((start - 1 + shift, end - 1 + shift, keys_of(present)))
        elif kind in ds.LIST_KINDS:
            for shape, c0, c1 in ds.part_spans(sc, kind, turn["lang"]):
                # the answer tokens that overlap the shape's words, [j0, j1)
                j0 = next(j for j, e in enumerate(ends) if e > c0)
                j1 = next(j for j, e in enumerate(ends) if e >= c1) + 1
                out.append((start + j0 - 1 + shift, start + j1 - 1 + shift, keys_of([shape])))
    return out


# The auxiliary target (training only, never shipped): a linear probe on each merged image
# token (the vision merger's output, what the decoder reads) predicts what the token shows:
# the kind, colour, place and size of the shape that covers it, or background (class 0).
# The answer loss alone rewards reading a shape's kind and place only through a few answer
# tokens a picture; the probe gives every token of every picture a label, so the tower learns
# to put kind, colour and (absolute, from its position embedding) place into each token.
AUX_CLASSES = (len(ds.KINDS) + 1, len(ds.COLOURS) + 1, len(ds.POSITIONS) + 1, len(ds.SIZES) + 1)
_COLOUR_NAMES = sorted(ds.COLOURS)
PATCH, MERGE = int(dm.PREPROCESSOR["patch_size"]), int(dm.PREPROCESSOR["merge_size"])


def token_owners(sc, label_map, grid, cover: float = 0.15):
    """[tokens] int64: which shape each merged token shows (shape index + 1; 0 = background),
    in the processor's order (rows of 2x2 patch windows, raster order). A token is a shape's
    when the shape covers >= `cover` of it, or it holds the most of a shape that covers no
    token that much (a small shape across four tokens still gets one)."""
    import numpy as np
    from PIL import Image

    _, gh, gw = (int(v) for v in grid)
    side = MERGE * PATCH  # a merged token's side in resized pixels
    m = np.asarray(Image.fromarray(label_map).resize((gw * PATCH, gh * PATCH), Image.NEAREST))
    n = len(sc.shapes)
    rows, cols = gh // MERGE, gw // MERGE
    blocks = m.reshape(rows, side, cols, side).transpose(0, 2, 1, 3).reshape(-1, side * side)
    counts = np.stack([(blocks == i + 1).sum(1) for i in range(n)], 1) / (side * side)  # [T, n]
    covered = counts.max(1) >= cover
    owner = np.zeros(len(blocks), np.int64)  # 0: background, else shape index + 1
    owner[covered] = counts.argmax(1)[covered] + 1
    for i in range(n):
        if not (owner == i + 1).any() and counts[:, i].max() > 0:
            owner[counts[:, i].argmax()] = i + 1
    return owner


def token_targets(sc, owner):
    """[tokens, 4] int64 classes (kind, colour, position, size; 0 = background) of the merged
    tokens, from token_owners."""
    import numpy as np

    n = len(sc.shapes)
    table = np.zeros((n + 1, 4), np.int64)
    for i, shape in enumerate(sc.shapes):
        table[i + 1] = (
            ds.KINDS.index(shape.kind) + 1,
            _COLOUR_NAMES.index(shape.colour) + 1,
            ds.POSITIONS.index(shape.position) + 1,
            ds.SIZES.index(shape.size) + 1,
        )
    return table[owner]


def batch_tensors(samples, pad_id, pad_token):
    import torch

    n = max(len(s[0]) for s in samples)
    ids = torch.full((len(samples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), n), -100, dtype=torch.long)
    mask = torch.zeros((len(samples), n), dtype=torch.long)
    for i, (a, b, *_) in enumerate(samples):
        ids[i, : len(a)] = torch.tensor(a)
        labels[i, : len(b)] = torch.tensor(b)
        mask[i, : len(a)] = 1
    kw = dict(input_ids=ids, attention_mask=mask, labels=labels)
    kw["mm_token_type_ids"] = (ids == pad_token).long()
    pix = [torch.from_numpy(s[2]) for s in samples if s[2] is not None]
    if pix:
        kw["pixel_values"] = torch.cat(pix)
        kw["image_grid_thw"] = torch.tensor([s[3] for s in samples if s[3] is not None])
    aux = [torch.from_numpy(s[4]) for s in samples if s[4] is not None]
    attend = [(i, *t) for i, s in enumerate(samples) for t in (s[5] or [])]
    return kw, (torch.cat(aux) if aux else None), attend


def train(args, folder: Path) -> dict:
    """Train with --procs data-parallel processes (one thread each by default: on a shared
    machine, separate processes lose less to a busy neighbour than threads that meet at a
    barrier in every op); rank 0 saves the model and returns the log."""
    if args.procs == 1:
        return _train_rank(0, args, folder)
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args.port = port
    mp.spawn(_spawned, args=(args, folder), nprocs=args.procs, join=True)
    return json.loads((folder / ".train_result.json").read_text())


def _spawned(rank, args, folder):
    result = _train_rank(rank, args, folder)
    if rank == 0:
        (folder / ".train_result.json").write_text(json.dumps(result))


def _train_rank(rank: int, args, folder: Path) -> dict:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    world = args.procs
    dist = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world
        )
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    torch.set_num_threads(args.threads)
    config = Qwen3VLConfig.from_pretrained(folder)
    # config.json says bfloat16 (the stored dtype); train in float32, store bf16 at the end
    if args.init:  # continue from a checkpoint this script wrote (fresh optimizer and warm-up)
        model = Qwen3VLForConditionalGeneration.from_pretrained(args.init, dtype=torch.float32)
    else:
        model = Qwen3VLForConditionalGeneration(config).to(torch.float32)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    enc = Encoder(folder)
    pad_id = enc.tok.token_id("<|endoftext|>")
    # the auxiliary probe (token_targets): one linear head per target on the merger's output,
    # trained with the model and dropped at the end (the shipped folder is the plain model)
    probe, merged = None, []
    if args.aux_weight > 0 or args.tower_minutes > 0:
        torch.manual_seed(args.seed + 1)
        probe = torch.nn.Linear(config.vision_config.out_hidden_size, sum(AUX_CLASSES))
        model.model.visual.merger.register_forward_hook(lambda mod, inp, out: merged.append(out))
    attention = {}  # decoder layer -> its attention weights [batch, heads, q, k] this step
    if args.attend_weight > 0:
        # eager attention returns the weights (sdpa does not); the text model only
        model.model.language_model.config._attn_implementation = "eager"
        for layer in args.attend_layers:
            attn = model.model.language_model.layers[layer].self_attn
            attn.register_forward_hook(
                lambda mod, inp, out, layer=layer: attention.__setitem__(layer, out[1])
            )
    tower_curve = []
    if args.tower_minutes > 0:
        tower_curve = _tower_phase(model, probe, merged, enc, args, rank, dist)
    extra = [probe.weight, probe.bias] if probe is not None and args.aux_weight > 0 else []
    trained = [*model.parameters(), *extra]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2] + extra[:1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2] + extra[1:]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )

    budget = args.minutes * 60 if args.minutes else 0.0
    t0 = time.time()

    def progress(step):
        """Fraction of training done: by steps, or by the time budget if that comes first
        (a shared machine: the schedule ends on time whatever the load)."""
        done = step / args.steps
        if budget:
            done = max(done, (time.time() - t0) / budget)
        return min(1.0, done)

    rng = random.Random(args.seed * 1000 + rank)
    per_rank = args.batch // world
    curve = []
    running = None
    params = trained
    for step in range(args.steps):
        done = progress(step)
        if dist is not None:  # every rank follows rank 0's clock
            flag = torch.tensor([done])
            dist.broadcast(flag, 0)
            done = float(flag[0])
        if done >= 1.0:
            if rank == 0:
                print(f"time budget reached at step {step}", flush=True)
            break
        samples = []
        for b in range(per_rank):
            index = step * args.batch + rank * per_rank + b
            image_seed, turns = make_conversation(rng, index, tuple(args.favour))
            system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.1 else None
            samples.append(enc.encode(image_seed, turns, system))
        kw, aux, attend = batch_tensors(samples, pad_id, enc.pad)
        lr = scheduled_lr(args.lr, step, args.warmup, done)
        for g in opt.param_groups:
            g["lr"] = lr
        merged.clear()
        attention.clear()
        answer_loss = model(**kw).loss
        loss, aux_value, attend_value = answer_loss, 0.0, 0.0
        if args.aux_weight > 0 and aux is not None:
            aux_loss, _ = probe_loss(probe, merged, aux)
            aux_value = float(aux_loss.detach())
            loss = loss + args.aux_weight * aux_loss
        if args.attend_weight > 0 and attend:
            attend_loss = attention_loss([attention[n] for n in args.attend_layers], attend)
            attend_value = float(attend_loss.detach())
            loss = loss + args.attend_weight * attend_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value, aux_value, attend_value = average_gradients(
            params, [float(answer_loss.detach()), aux_value, attend_value], dist
        )
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        running = value if running is None else 0.95 * running + 0.05 * value
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            elapsed = time.time() - t0
            curve.append(
                {
                    "step": step,
                    "loss": round(value, 4),
                    "smoothed": round(running, 4),
                    "aux": round(aux_value, 4),
                    "attend": round(attend_value, 4),
                    "lr": round(lr, 6),
                    "seconds": round(elapsed, 1),
                }
            )
            print(
                f"step {step:5d}  loss {value:.4f}  smoothed {running:.4f}  aux {aux_value:.3f}  "
                f"attend {attend_value:.3f}  "
                f"lr {lr:.2e}  {elapsed:7.1f}s",
                flush=True,
            )
    else:
        step = args.steps
    wall = time.time() - t0
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return {}
    model.eval()
    model.to(torch.bfloat16)
    model.save_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.chmod(0o644)
    return {
        "steps_done": step,
        "wall_seconds": round(wall, 1),
        "parameters": n_params,
        "tower_curve": tower_curve,
        "curve": curve,
    }


def scheduled_lr(peak: float, step: int, warmup: int, done: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 5% of `peak` as `done`
    (the fraction of the phase's steps or time budget) goes from 0 to 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))


def probe_loss(probe, merged, aux):
    """(mean cross-entropy of the four probe heads, kind accuracy on shape tokens) of the
    merged image tokens the forward hook collected, against token_targets' classes."""
    import torch

    tokens = torch.cat(merged)  # normalised: the probe's loss starts near log(classes)
    tokens = torch.nn.functional.layer_norm(tokens, tokens.shape[-1:])
    logits = probe(tokens).split(AUX_CLASSES, dim=-1)
    loss = sum(
        torch.nn.functional.cross_entropy(lg, aux[:, j]) for j, lg in enumerate(logits)
    ) / len(AUX_CLASSES)
    on_shape = aux[:, 0] > 0
    kind_right = (logits[0].argmax(-1) == aux[:, 0])[on_shape].float().mean()
    return loss, float(kind_right)


def attention_loss(weights, attend):
    """Mean of -log(attention mass on the named shapes' image tokens) of head 0 of each
    supervised layer (`weights`: [batch, heads, q, k] each), over the query positions of
    attend_targets' answers (`attend`: (sample, first query, end, key positions)).

    Why: the answer loss alone did not teach the decoder to find the image token of the
    shape a question names: colour and place answers named another shape's attribute
    however long it trained (docs/demo-model.md, item 7), while the tokens hold kind, colour
    and place (the probe reads them). This says where to look; what to copy from there is
    left to the answer loss. Training only: the saved model is the plain architecture."""
    import torch

    terms = []
    for w in weights:
        for b, q0, q1, keys in attend:
            mass = w[b, 0, q0:q1][:, keys].sum(-1)
            terms.append(-torch.log(mass.clamp_min(1e-6)))
    return torch.cat(terms).mean()


def average_gradients(params, logged: list[float], dist) -> list[float]:
    """Average the parameters' gradients and the logged figures over the ranks (one flat
    buffer, one all-reduce); a no-op with one process. Returns the averaged figures."""
    import torch

    if dist is None:
        return logged
    world = dist.get_world_size()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor(logged)])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    return [float(v) for v in flat[len(flat) - len(logged) :]]


TOWER_SEEDS = 4_000_000  # the tower phase's pictures: apart from the conversations' (index),
# demo_probe.py's (2 and 3 million) and the evaluation's (10^9)


def _tower_phase(model, probe, merged, enc, args, rank, dist) -> list[dict]:
    """Train the vision tower and the probe alone on token_targets for --tower-minutes.

    Why: the answer loss teaches a shape's kind only through the few answer tokens that name
    it, and a full run spends its steps on the language; the tower then reads colours, places
    and sizes almost perfectly and kinds barely above chance (docs/demo-model.md, item 5). The
    probe labels every image token of every picture, and without the decoder a step costs a
    fraction of a full one. Pictures only, --batch a step; the full phase's schedule
    (scheduled_lr) over its own time budget; every rank follows rank 0's clock. The decoder
    is untouched.
    """
    import torch

    visual = model.model.visual
    # the DeepStack mergers get no gradient from the probe: left out, not decayed
    tower = [p for n, p in visual.named_parameters() if not n.startswith("deepstack_merger")]
    params = [*tower, probe.weight, probe.bias]
    opt = torch.optim.AdamW(params, lr=args.tower_lr, betas=(0.9, 0.98), weight_decay=0.01)
    world = dist.get_world_size() if dist is not None else 1
    per_rank = args.batch // world
    budget, t0 = args.tower_minutes * 60, time.time()
    curve, running = [], None
    step = 0
    while True:
        done = torch.tensor([min(1.0, (time.time() - t0) / budget)])
        if dist is not None:
            dist.broadcast(done, 0)
        if float(done) >= 1.0:
            break
        lr = scheduled_lr(args.tower_lr, step, args.warmup, float(done))
        for g in opt.param_groups:
            g["lr"] = lr
        pixels, grids, targets = [], [], []
        for b in range(per_rank):
            seed = TOWER_SEEDS + step * args.batch + rank * per_rank + b
            _, _, pix, grid, aux, _ = enc.encode(seed, [{"q": "?", "a": "."}])
            pixels.append(torch.from_numpy(pix))
            grids.append(grid)
            targets.append(torch.from_numpy(aux))
        merged.clear()
        visual(torch.cat(pixels), grid_thw=torch.tensor(grids))
        loss, kind_right = probe_loss(probe, merged, torch.cat(targets))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value, kind_right = average_gradients(params, [float(loss.detach()), kind_right], dist)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        running = kind_right if running is None else 0.98 * running + 0.02 * kind_right
        if rank == 0 and step % args.log_every == 0:
            elapsed = time.time() - t0
            curve.append(
                {
                    "step": step,
                    "probe_loss": round(value, 4),
                    "kind_accuracy": round(running, 4),
                    "lr": round(lr, 6),
                    "seconds": round(elapsed, 1),
                }
            )
            print(
                f"tower {step:5d}  probe loss {value:.4f}  kind accuracy {running:.3f}  "
                f"lr {lr:.2e}  {elapsed:7.1f}s",
                flush=True,
            )
        step += 1
    merged.clear()
    return curve


def write_config_457(folder: Path, config: dict) -> None:
    """save_pretrained wrote the 5.x spelling; ship the published 4.57 one (what hub files use)."""
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_transformers(folder: Path, threads: int):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    torch.set_num_threads(threads)
    return Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def transformers_answer(hf, enc: Encoder, image, question: str) -> str:
    """transformers' greedy answer (f32) to `question` about the PIL `image`, as Merlin prompts."""
    import torch

    prepared = prepare_pil(image, enc.pre)
    pixels, grid = prepared.pixel_values, prepared.grid_thw
    prompt = enc.tok.encode_chat(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
        add_generation_prompt=True,
    )
    at = prompt.index(enc.pad)
    n_pad = grid[0] * grid[1] * grid[2] // 4
    prompt = prompt[:at] + [enc.pad] * n_pad + prompt[at + 1 :]
    stops = {enc.im_end, enc.tok.token_id("<|endoftext|>")}
    t_ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            input_ids=t_ids,
            attention_mask=torch.ones_like(t_ids),
            mm_token_type_ids=(t_ids == enc.pad).long(),
            pixel_values=torch.from_numpy(pixels),
            image_grid_thw=torch.tensor([grid]),
            max_new_tokens=96,
            do_sample=False,
            eos_token_id=sorted(stops),
        )
    return enc.tok.decode([t for t in out[0, len(prompt) :].tolist() if t not in stops])


def check(folder: Path, n: int, threads: int) -> dict:
    """Greedy answers of transformers and Merlin on held-out scenes: equal, and how right."""
    hf = load_transformers(folder, threads)
    enc = Encoder(folder)

    from merlin.engine.model import load_model
    from merlin.engine.sampling import SamplingParams
    from merlin.engine.session import Message, Session

    merlin = load_model(folder, weights="f32", kv="f32")
    greedy = SamplingParams(temperature=0.0, top_k=0, top_p=1.0)
    same = right = total = 0
    per_kind = {}
    for kind in ds.QUESTION_KINDS:
        per_kind[kind] = 0
        for i in range(n):
            sc, q = ds.eval_case(kind, i)
            image = ds.draw(sc)
            hf_text = transformers_answer(hf, enc, image, q.text)
            session = Session(merlin)
            events = session.respond(
                [Message.user(q.text, [image])], sampling=greedy, max_new_tokens=96, spec="off"
            )
            for _ in events:
                pass
            m_text = session.messages[-1].text
            same += hf_text == m_text
            right += m_text == q.answer
            per_kind[kind] += m_text == q.answer
            total += 1
            if m_text != hf_text:
                print(f"  differ [{kind}] {q.text!r}: transformers {hf_text!r} merlin {m_text!r}")
    return {
        "cases": total,
        "merlin_equals_transformers": same,
        "merlin_exact": right,
        "exact_per_kind": {k: f"{v}/{n}" for k, v in per_kind.items()},
    }


def record_self_test(folder: Path, threads: int) -> dict:
    """Write the folder's self-test reference: transformers' answer on the showcase picture."""
    hf = load_transformers(folder, threads)
    question = dm.SELF_TEST_QUESTION
    answer = transformers_answer(hf, Encoder(folder), ds.draw(ds.SHOWCASE), question)
    truth = ds.answer(ds.SHOWCASE, "colour", "en", "circle")
    reference = {"question": question, "answer": answer, "truth": truth}
    (folder / dm.SELF_TEST_FILE).write_text(json.dumps(reference, ensure_ascii=False) + "\n")
    print(f"self-test reference: {answer!r} (the picture's truth: {truth!r})")
    return reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument(
        "--minutes", type=float, default=0, help="time budget: the schedule ends by then"
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--aux-weight",
        type=float,
        default=0.0,
        help="weight of the per-image-token probe loss (token_targets); 0 (the shipped "
        "recipe) leaves it out",
    )
    ap.add_argument(
        "--tower-minutes",
        type=float,
        default=0.0,
        help="first train the vision tower alone on the probe's targets for this long "
        "(0, the shipped recipe: no tower phase)",
    )
    ap.add_argument("--tower-lr", type=float, default=2e-3)
    ap.add_argument(
        "--attend-weight",
        type=float,
        default=0.0,
        help="weight of the attention target (attention_loss): head 0 of --attend-layers "
        "looks at the shape a colour/where/bigger question names, and at each shape while "
        "an answer lists or describes it; 0 (the shipped recipe) leaves it out",
    )
    ap.add_argument("--attend-layers", type=int, nargs="+", default=[2, 3])
    ap.add_argument(
        "--favour",
        action="append",
        default=[],
        choices=ds.QUESTION_KINDS,
        help="ask this question kind twice as often (repeatable; none: all kinds alike)",
    )
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=20260)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--procs", type=int, default=2, help="data-parallel processes")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--init", type=Path, default=None, help="start from this checkpoint")
    ap.add_argument("--check", type=int, default=10, help="held-out cases per question kind")
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "demo-model")
    ap.add_argument("--install", action="store_true", help="move the result into the package")
    ap.add_argument("--force", action="store_true", help="replace the shipped checkpoint")
    ap.add_argument(
        "--record-self-test",
        type=Path,
        metavar="FOLDER",
        help="only write FOLDER's self-test reference (transformers' showcase answer)",
    )
    args = ap.parse_args(argv)
    if args.record_self_test:
        record_self_test(args.record_self_test, args.threads)
        return 0

    target = dm.shipped_dir()
    if args.install and (target / "model.safetensors").exists() and not args.force:
        print(
            f"{target} already holds the shipped demo model; pass --force to replace it.",
            file=sys.stderr,
        )
        return 2
    folder = args.build
    if folder.exists():
        shutil.rmtree(folder)
    config = dm.write_side_files(folder)
    import torch
    import transformers

    result = train(args, folder)
    write_config_457(folder, config)
    dm.write_generation_config(folder, config)  # save_pretrained replaced it
    (folder / "README.md").write_text(
        f"# {dm.DEMO_MODEL_NAME}\n\nMerlin's demo model: a tiny Qwen3-VL trained by the project "
        "on pictures of shapes (scripts/train_demo.py; docs/demo-model.md). It answers "
        "questions about shapes and colours in English and Chinese; load a Qwen3-VL "
        "checkpoint for real answers.\n"
    )
    verdict = check(folder, args.check, args.threads)
    record_self_test(folder, args.threads)
    log = {
        "seed": args.seed,
        "init": str(args.init) if args.init else None,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "warmup": args.warmup,
        "aux_weight": args.aux_weight,
        "tower_minutes": args.tower_minutes,
        "tower_lr": args.tower_lr,
        "favour": args.favour,
        "attend_weight": args.attend_weight,
        "attend_layers": args.attend_layers,
        "threads": args.threads,
        "procs": args.procs,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "load_average_at_end": os.getloadavg(),
        **result,
        "check": verdict,
    }
    (folder / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(json.dumps({k: v for k, v in log.items() if k != "curve"}, indent=1))
    if verdict["merlin_equals_transformers"] != verdict["cases"]:
        print("Merlin and transformers disagree; not installing.", file=sys.stderr)
        return 1
    if args.install:
        tmp = target.with_name(target.name + ".new")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
        print(f"installed into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
