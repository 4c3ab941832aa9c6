"""harness/rank/token_file.py (data=tokens): windows read from a real token file, the same global batches in every
process layout, and every bad file refused in the parent with one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from examples.tokens import write_tokens
from harness import cli
from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import tokens
from harness.rank import token_file
from harness.rank.token_file import TokenFileSource, check_token_file


def raw(tmp_path, ids, dtype="uint16"):
    path = tmp_path / "ids.bin"
    np.asarray(ids, dtype=dtype).tofile(path)
    return DataConfig(name="tokens", file=str(path), token_dtype=dtype)


def test_each_sample_is_a_window_and_its_next_tokens(tmp_path):
    """ids 0, 1, 2, ...: a window starting at o is o..o+7 in, o+1..o+8 out."""
    data = raw(tmp_path, np.arange(1000))
    source = TokenFileSource(data, seq_len=8, global_batch=4, local_batch=4, shard=0, device=torch.device("cpu"),
                             seed=0)
    x, y = source.next()
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    starts = x[:, 0]
    assert torch.equal(x, starts[:, None] + torch.arange(8)) and torch.equal(y, x + 1)
    assert int(starts.max()) <= 1000 - 9  # the last window still has its next token
    assert source.waited > 0


def test_the_shards_of_every_global_batch_are_the_batch_one_process_reads(tmp_path):
    """Every rank draws the same offsets (not one stream per rank) and keeps its consecutive slice."""
    data = raw(tmp_path, np.random.default_rng(0).integers(0, 50_000, 5000), "uint32")
    whole = TokenFileSource(data, 16, 8, 8, 0, torch.device("cpu"), seed=3)
    halves = [TokenFileSource(data, 16, 8, 4, shard, torch.device("cpu"), seed=3) for shard in (0, 1)]
    assert torch.equal(whole.first()[0], torch.cat([h.first()[0] for h in halves]))
    for _ in range(3):
        x, y = whole.next()
        parts = [h.next() for h in halves]
        assert torch.equal(x, torch.cat([p[0] for p in parts])) and torch.equal(y, torch.cat([p[1] for p in parts]))
    other_seed = TokenFileSource(data, 16, 8, 8, 0, torch.device("cpu"), seed=4).next()[0]
    assert not torch.equal(other_seed, x)


def test_an_npy_file_is_read_with_its_own_dtype(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(100, dtype=np.int32))
    data = DataConfig(name="tokens", file=str(path))  # token_dtype (uint16) is for raw files only
    assert check_token_file(data, tokens(8, 100)) == 100
    x, y = TokenFileSource(data, 8, 2, 2, 0, torch.device("cpu"), seed=0).next()
    assert torch.equal(y, x + 1)


def test_the_example_writes_bytes_as_uint16(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"ab")
    (tmp_path / "b.txt").write_bytes(b"\xff")
    assert write_tokens([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "t.bin") == 3
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint16).tolist() == [97, 98, 255]


def test_an_id_beyond_the_vocabulary_is_found_anywhere_in_the_file(tmp_path, monkeypatch):
    ids = np.zeros(100, dtype=np.uint16)
    ids[97] = 64  # in the last of several chunks
    monkeypatch.setattr(token_file, "SCAN_CHUNK", 10)
    with pytest.raises(ConfigError, match="token ids below model.vocab_size \\(64\\); it holds 64"):
        check_token_file(raw(tmp_path, ids), tokens(8, 64))
    assert check_token_file(raw(tmp_path, ids), tokens(8, 65)) == 100


@pytest.mark.parametrize(("ids", "seq_len", "words"), [
    (np.arange(8, dtype=np.uint16), 8, "at least model.seq_len + 1 = 9 tokens; it holds 8"),
    (np.arange(7, dtype=np.uint8), 4, "readable file of token ids"),  # 7 bytes: not a whole number of uint16
])
def test_a_file_too_short_or_not_whole_ids_is_named(tmp_path, ids, seq_len, words):
    path = tmp_path / "ids.bin"
    ids.tofile(path)
    with pytest.raises(ConfigError, match="data.file=") as info:
        check_token_file(DataConfig(name="tokens", file=str(path)), tokens(seq_len, 256))
    assert words in str(info.value)


def test_float_values_are_not_token_ids(tmp_path):
    np.save(tmp_path / "f.npy", np.ones(100, dtype=np.float32))
    with pytest.raises(ConfigError, match="integer token ids; this file holds float32"):
        check_token_file(DataConfig(name="tokens", file=str(tmp_path / "f.npy")), tokens(8, 256))


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (("data.file=/no/such.bin",), "data.file=/no/such.bin", "a file of token ids"),
    (("model.vocab_size=100",), "data.file=", "below model.vocab_size (100); it holds 1"),
    (("data.token_dtype=uint8",), "data.token_dtype=uint8", "uint16"),
    (("model=tiny_cnn",), "data=tokens", "data=tokens feeds a language model"),
    (("data.pool=4",), "data.pool=4", "data=tokens"),
])
def test_bad_token_input_is_one_line_before_anything_starts(tmp_path, overrides, key, words, capsys):
    path = tmp_path / "ids.bin"
    np.full(500, 199, dtype=np.uint16).tofile(path)
    with pytest.raises(SystemExit) as info:
        cli.precheck(["model=gpt", "data=tokens", f"data.file={path}", "plan.predict=false", *overrides])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {key}") and words in lines[0], lines
