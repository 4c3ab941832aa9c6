"""harness/core/inputs.py: what one sample is (images, token sequences), the batches made of it, and the one loss
every workload trains with."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.core.config import DataConfig
from harness.core.inputs import REPEAT_NEXT, images, inputs_of, loss, tokens


def test_the_loss_is_the_mean_over_every_token_as_worked_by_hand():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [3.0, 1.0]]])  # (N=2, T=2, V=2)
    targets = torch.tensor([[0, 1], [1, 0]])
    by_hand = [math.log(1 + math.exp(-2)), math.log(2), math.log(1 + math.exp(-1)), math.log(1 + math.exp(-2))]
    assert loss(logits, targets).item() == pytest.approx(sum(by_hand) / 4)
    classes = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # a classifier's (N, C): F.cross_entropy itself
    assert loss(classes, torch.tensor([0, 1])).item() == pytest.approx(F.cross_entropy(classes, torch.tensor([0, 1])).item())


def test_token_batches_are_next_token_pairs_mostly_following_one_table():
    spec = tokens(seq_len=16, vocab_size=50)
    (x, y), = spec.batches(1, 400, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (400, 16) and x.dtype == torch.long and int(x.max()) < 50
    assert torch.equal(x[:, 1:], y[:, :-1])  # each target is the next input: next-token prediction
    # the table: the most common successor of each token, from the first batch; it holds in fresh batches
    table = {}
    for a, b in zip(x.flatten().tolist(), y.flatten().tolist(), strict=True):
        table.setdefault(a, []).append(b)
    best = {a: max(set(bs), key=bs.count) for a, bs in table.items()}
    (x2, y2), = spec.batches(1, 400, torch.Generator().manual_seed(0))
    hits = sum(best.get(a) == b for a, b in zip(x2.flatten().tolist(), y2.flatten().tolist(), strict=True))
    assert hits / x2.numel() == pytest.approx(REPEAT_NEXT + (1 - REPEAT_NEXT) / 50, abs=0.03)
    (x3, _), = spec.batches(1, 400, torch.Generator().manual_seed(1))
    assert not torch.equal(x, x3)  # another seed, other sequences


def test_what_a_sample_counts_as():
    assert tokens(128, 1000).tokens_per_sample == 128 and images(32, 10).tokens_per_sample is None
    assert tokens(128, 1000).input_bytes == 2 * 128 * 8  # int64 ids in and out
    assert images(32, 10).input_bytes == 3 * 32 * 32 * 4 + 8
    assert dict(images(32, 10).provided) == {"num_classes": 10} and not tokens(8, 8).provided
    x, y = tokens(8, 20).example(3)
    assert x.shape == y.shape == (3, 8)
    x, y = images(4, 10).example(3)
    assert x.shape == (3, 3, 4, 4) and y.shape == (3,)


def test_a_model_says_what_it_takes_or_takes_images():
    data = DataConfig(name="synthetic", image_size=8, num_classes=10)
    assert inputs_of({"_target_": "harness.rank.models.TinyCNN"}, data) == images(8, 10)
    assert inputs_of({"_target_": "harness.rank.gpt.GPT", "seq_len": 32}, data) == tokens(32, 256)  # GPT's vocab
