"""Input-bound by pure-Python text processing in ``__getitem__`` with ``num_workers=0``: each
sample is a ~600-word synthetic document, lower-cased, split by a regular expression, each word
looked up in a 20k-word vocabulary dict (unknown words split into character trigrams looked up
again), truncated and padded to 512 ids; an EmbeddingBag(20k, 32, sparse gradient) + 2-layer MLP
model, SGD, batch 32.

The loading is interpreter work under the GIL (no numpy, no C kernel releasing it), unlike a
decompressing or a numpy-augmenting loader. Truth: the time in ``next(loader)`` over the step,
in the same run.
"""

from __future__ import annotations

import random
import re

import _zoo
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

_WORD = re.compile(r"[a-z0-9']+")
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def _word(rng: random.Random) -> str:
    n = rng.randint(2, 10)
    return "".join(rng.choice(_LETTERS[: rng.randint(6, 26)]) for _ in range(n))


class Texts(Dataset):
    def __init__(self, n: int, seed: int, vocab: int = 20000, length: int = 512) -> None:
        rng = random.Random(seed)
        words = list({_word(rng) for _ in range(3 * vocab)})
        self.vocab = {w: i + 2 for i, w in enumerate(words[: vocab - 2 - 4000])}
        for a in _LETTERS:  # trigram fallbacks for unknown words
            for b in _LETTERS[:12]:
                for c in _LETTERS[:12]:
                    if len(self.vocab) < vocab - 2:
                        self.vocab.setdefault(a + b + c, len(self.vocab) + 2)
        pool = words[: vocab + 6000]  # some words are not in the vocabulary
        self.docs = [" ".join(rng.choice(pool).capitalize() if rng.random() < 0.1
                              else rng.choice(pool) for _ in range(rng.randint(500, 700)))
                     + "." for _ in range(64)]
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.n

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        for w in _WORD.findall(text.lower()):
            i = self.vocab.get(w)
            if i is not None:
                ids.append(i)
                continue
            for k in range(0, len(w), 3):
                ids.append(self.vocab.get(w[k:k + 3], 1))
        return ids

    def __getitem__(self, i: int):
        ids = self.tokenize(self.docs[i % len(self.docs)])[: self.length]
        ids += [0] * (self.length - len(ids))
        return torch.tensor(ids), i % 5


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=4)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--batch", type=int, default=32)
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    data = Texts(args.batch * (args.steps + 20), args.seed)
    model = nn.ModuleDict({"emb": nn.EmbeddingBag(20000, 32, mode="mean", padding_idx=0, sparse=True),
                           "mlp": nn.Sequential(nn.Linear(32, 256), nn.ReLU(),
                                                nn.Linear(256, 5))})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, foreach=args.foreach or None)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    it = iter(loader)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with timer.part("input_wait"):
                x, y = next(it)
            loss = nn.functional.cross_entropy(model["mlp"](model["emb"](x)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    w = _zoo.median(timer.parts["input_wait"][args.warmup:])
    st = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"input_wait_ms": w, "input_wait_share": w / st}
    _zoo.finish("tokenize_loader", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "threads": threads})


if __name__ == "__main__":
    main()
