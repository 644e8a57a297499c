"""The real data pipelines of the thread tests and benchmarks, in one copy: an ImageFolder-shaped tree of JPEGs
generated with Pillow, a ``tokenizers`` BPE tokenizer trained here on generated text, and the stages a DataLoader
item goes through (``ImageFolderLike``): Pillow decode and resize (``pil``), OpenCV decode, blur and resize
(``opencv``), numpy features through OpenBLAS (``blas``: a matrix product, threaded at this size) and numexpr
(``numexpr``); ``Collate`` encodes the items' captions with the tokenizer (Rayon, in the worker).
tests/programs/thread_homes_probe.py runs every stage in one dataset; benchmarks/thread_pipelines_rank.py runs
them one pipeline at a time. OpenCV, numexpr and tokenizers are optional: without OpenCV the image comes from
Pillow, without numexpr numpy scales the features, without tokenizers the collate counts characters.
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

try:
    import cv2
except ImportError:
    cv2 = None
try:
    import numexpr
except ImportError:
    numexpr = None
try:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError:
    Tokenizer = None

WORDS = ("cat", "dog", "bird", "tree", "house", "river", "stone", "cloud", "light", "night", "green", "blue")
STAGES = ("pil", "opencv", "blas", "numexpr")
Item = tuple[torch.Tensor, torch.Tensor, str]


def make_images(root: str, classes: int, per_class: int, shape: tuple[int, int] = (96, 128)) -> list[tuple[str, int]]:
    """An ImageFolder tree of generated JPEGs (``shape``: height, width): (path, class index) per image."""
    rng = np.random.default_rng(0)
    items = []
    for k in range(classes):
        folder = os.path.join(root, f"class_{k}")
        os.makedirs(folder)
        for i in range(per_class):
            path = os.path.join(folder, f"image_{i}.jpg")
            Image.fromarray(rng.integers(0, 255, (*shape, 3), dtype=np.uint8)).save(path, quality=90)
            items.append((path, k))
    return items


def make_tokenizer() -> Any:
    """A BPE tokenizer trained on generated sentences of ``WORDS``; None without ``tokenizers``."""
    if Tokenizer is None:
        return None
    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"],
                                                            show_progress=False))
    return tokenizer


def caption(label: int, words: int = 6) -> str:
    return " ".join(WORDS[(label + j) % len(WORDS)] for j in range(words))


class ImageFolderLike(Dataset):  # type: ignore[type-arg]
    """(image, features, caption) per item; ``stages`` picks the work (every stage by default). The image is
    OpenCV's with ``opencv``, else Pillow's resize with ``pil``, else empty; the features are empty without
    ``blas``; ``caption_words`` sets the caption's length."""

    def __init__(self, items: list[tuple[str, int]], stages: Collection[str] = STAGES, size: tuple[int, int] = (64, 48),
                 caption_words: int = 6) -> None:
        self.items, self.stages, self.size, self.caption_words = items, frozenset(stages), size, caption_words
        self.weights = np.random.default_rng(1).standard_normal((384, 384)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Item:
        path, label = self.items[i]
        image = features = torch.zeros(0)
        if self.stages:
            with open(path, "rb") as fh:
                data = fh.read()
            pil = None
            if self.stages & {"pil", "blas"}:
                pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
            if "opencv" in self.stages and cv2 is not None:
                decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
                small = cv2.resize(cv2.GaussianBlur(decoded, (5, 5), 0), self.size, interpolation=cv2.INTER_AREA)
                image = torch.from_numpy(small.astype(np.float32))
            elif pil is not None and ("pil" in self.stages or "opencv" in self.stages):
                resized = Image.fromarray(pil.astype(np.uint8)).resize(self.size, Image.Resampling.BILINEAR)
                image = torch.from_numpy(np.asarray(resized, dtype=np.float32))
            if "blas" in self.stages and pil is not None:
                product = np.tile(pil.reshape(-1)[:384], (384, 1)) @ self.weights  # OpenBLAS: threaded at this size
                if "numexpr" in self.stages and numexpr is not None:
                    product = numexpr.evaluate("product * 0.5 + 1")
                elif "numexpr" in self.stages:
                    product = product * 0.5 + 1
                features = torch.from_numpy(product[:4, :4].copy())
        return image, features, caption(label, self.caption_words)


class Collate:
    """Stacks the items and encodes their captions with ``tokenizer`` (``encode_batch``: Rayon, in the worker)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: list[Item]) -> tuple[torch.Tensor, list[list[int]]]:
        captions = [text for _, _, text in batch]
        images = torch.stack([image for image, _, _ in batch])
        if self.tokenizer is None:
            return images, [[len(c)] for c in captions]
        return images, [e.ids for e in self.tokenizer.encode_batch(captions)]
