"""What a demo checkpoint's image tokens carry: linear probes on frozen vision features.

For drawn scenes, the vision tower's merged tokens (what the decoder reads) and its DeepStack
features, each token labelled with the kind, colour, place and size of the shape that covers
it (train_demo.token_targets). A logistic-regression probe per fact is fitted on the tokens
of `--train` scenes and scored on the shape tokens of `--test` other scenes. A fact the probe
reads at ~100% is in the tokens, and a wrong answer about it is the decoder's; a fact it
cannot read (chance: 1 / 6 kinds, 1 / 8 colours) the tower never extracted. Runs in the torch
venv, like scripts/train_demo.py:

    /work/venvs/torch/bin/python scripts/demo_probe.py [CHECKPOINT] [--train N] [--test N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import train_demo  # noqa: E402

FACTS = ("kind", "colour", "position", "size")
TRAIN_SEEDS, TEST_SEEDS = 2_000_000, 3_000_000  # apart from training (< 10^6) and eval (10^9)


def features(model, enc, seeds):
    """(merged tokens, DeepStack features side by side, targets) of the scenes `seeds`."""
    import torch

    merged, deep, targets = [], [], []
    for seed in seeds:
        _, _, pixels, grid, aux = enc.encode(seed, [{"q": "?", "a": "."}])
        with torch.no_grad():
            out = model.model.visual(torch.from_numpy(pixels), grid_thw=torch.tensor([grid]))
        merged.append(out.pooler_output)
        deep.append(torch.cat(list(out.deepstack_features), -1))
        targets.append(torch.from_numpy(aux))
    return torch.cat(merged), torch.cat(deep), torch.cat(targets)


def probe_accuracy(train_x, train_y, test_x, test_y, classes: int, epochs: int = 300) -> float:
    """Held-out accuracy of a logistic regression fitted on standardised features."""
    import torch

    mean, std = train_x.mean(0), train_x.std(0) + 1e-5
    a, b = (train_x - mean) / std, (test_x - mean) / std
    linear = torch.nn.Linear(a.shape[1], classes)
    opt = torch.optim.Adam(linear.parameters(), 1e-2)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(linear(a), train_y).backward()
        opt.step()
    with torch.no_grad():
        return float((linear(b).argmax(1) == test_y).float().mean())


def main(argv=None) -> int:
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "checkpoint", nargs="?", type=Path, default=ROOT / "src/merlin/resources/demo-model"
    )
    ap.add_argument("--train", type=int, default=3000, help="scenes to fit the probes on")
    ap.add_argument("--test", type=int, default=600, help="held-out scenes to score them on")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    enc = train_demo.Encoder(args.checkpoint)
    model = Qwen3VLForConditionalGeneration.from_pretrained(args.checkpoint, dtype=torch.float32)
    model.eval()
    train = features(model, enc, range(TRAIN_SEEDS, TRAIN_SEEDS + args.train))
    test = features(model, enc, range(TEST_SEEDS, TEST_SEEDS + args.test))
    on_shape, test_on_shape = train[2][:, 0] > 0, test[2][:, 0] > 0
    print(f"{int(on_shape.sum())} shape tokens to fit, {int(test_on_shape.sum())} to score")
    for where, column in (("merged tokens", 0), ("DeepStack features", 1)):
        for j, fact in enumerate(FACTS):
            accuracy = probe_accuracy(
                train[column][on_shape],
                train[2][on_shape, j],
                test[column][test_on_shape],
                test[2][test_on_shape, j],
                train_demo.AUX_CLASSES[j],
            )
            print(f"{where:20s} {fact:9s} {accuracy:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
