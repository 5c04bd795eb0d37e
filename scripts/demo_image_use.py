"""How much a demo checkpoint's answers depend on the picture, per question kind.

For held-out scenes (engine.demo_scenes.eval_case), the loss of the reference answer given its
own picture and given another scene's picture of the same size. Equal losses mean the model
answers that kind from the question alone (it ignores the image); a large gap means it reads
the picture. Runs in the torch venv, like scripts/train_demo.py:

    /work/venvs/torch/bin/python scripts/demo_image_use.py [CHECKPOINT] [--cases N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import train_demo  # noqa: E402

from merlin.engine import demo_scenes as ds  # noqa: E402
from merlin.engine.vision.preprocess import prepare_pil  # noqa: E402

SIDE = 160  # both pictures at one size, so the other picture fills the same image pads


def sample(enc, scene, question):
    prepared = prepare_pil(ds.draw(scene, SIDE, SIDE), enc.pre)
    content = [{"type": "image"}, {"type": "text", "text": question.text}]
    prompt = enc.tok.encode_chat([{"role": "user", "content": content}])
    answer = enc.tok.encode_text(question.answer) + [enc.im_end]
    t, h, w = prepared.grid_thw
    at = prompt.index(enc.pad)
    prompt = prompt[:at] + [enc.pad] * (t * h * w // 4) + prompt[at + 1 :]
    labels = [-100] * len(prompt) + answer
    return prompt + answer, labels, prepared.pixel_values, prepared.grid_thw


def main() -> int:
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", nargs="?", type=Path, default=ROOT / "build" / "demo-model")
    ap.add_argument("--cases", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hf = Qwen3VLForConditionalGeneration.from_pretrained(args.checkpoint, dtype=torch.float32)
    hf.eval()
    enc = train_demo.Encoder(args.checkpoint)
    pad_id = enc.tok.token_id("<|endoftext|>")
    for kind in ds.QUESTION_KINDS:
        own = other = 0.0
        for i in range(args.cases):
            scene, question = ds.eval_case(kind, i)
            elsewhere, _ = ds.eval_case(kind, i + 100_000)
            ids, labels, pixels, grid = sample(enc, scene, question)
            _, _, pixels2, _ = sample(enc, elsewhere, question)
            with torch.no_grad():
                for which, pix in (("own", pixels), ("other", pixels2)):
                    batch = train_demo.batch_tensors([(ids, labels, pix, grid)], pad_id, enc.pad)
                    loss = hf(**batch).loss.item() / args.cases
                    if which == "own":
                        own += loss
                    else:
                        other += loss
        print(f"{kind:9s} answer loss with its own picture {own:.3f}, with another {other:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
