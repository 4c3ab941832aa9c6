"""harness.rank.data: every strategy sees the same global batches; ranks hold consecutive shards of them."""

from __future__ import annotations

import torch

from harness.rank.data import synthetic_batches

CPU = torch.device("cpu")


def test_the_ranks_shards_make_the_one_process_global_batch_in_order():
    whole = synthetic_batches(3, 8, 8, 0, image_size=4, num_classes=10, device=CPU, seed=5)
    shards = [synthetic_batches(3, 8, 2, rank, image_size=4, num_classes=10, device=CPU, seed=5) for rank in range(4)]
    for k in range(3):
        assert torch.equal(torch.cat([s[k][0] for s in shards]), whole[k][0])
        assert torch.equal(torch.cat([s[k][1] for s in shards]), whole[k][1])
        assert shards[1][k][0].shape == (2, 3, 4, 4)


def test_the_pool_holds_distinct_batches_fixed_by_the_seed():
    pool = synthetic_batches(4, 6, 6, 0, image_size=4, num_classes=10, device=CPU, seed=1)
    assert not torch.equal(pool[0][0], pool[1][0])
    again = synthetic_batches(4, 6, 6, 0, image_size=4, num_classes=10, device=CPU, seed=1)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(pool, again, strict=True))
    other = synthetic_batches(1, 6, 6, 0, image_size=4, num_classes=10, device=CPU, seed=2)
    assert not torch.equal(other[0][0], pool[0][0])


def test_each_image_is_its_class_pattern_plus_noise_so_the_task_can_be_learnt():
    (images, labels), = synthetic_batches(1, 400, 400, 0, image_size=4, num_classes=2, device=CPU, seed=3)
    first, second = images[labels == 0].mean(0), images[labels == 1].mean(0)
    assert (first - second).abs().mean() > 0.5  # the classes differ by more than the noise averages to
