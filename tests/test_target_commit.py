"""TargetRunner.commit: the accepted tree nodes' keys and values end at the committed slots, and
nodes already in place are not moved."""

import pytest
import torch

from eagle3_ext.decoding.capture import AuxHiddenCapture
from eagle3_ext.decoding.target import TargetRunner
from tiny_models import make_target


def runner_with_tree(tmp_path, lengths, tree_nodes):
    """A runner after a prefill of ``lengths`` (ragged when they differ) and a tree of
    ``tree_nodes`` random keys / values appended at the cache's end, as verify leaves it."""
    target, _ = make_target(str(tmp_path), layers=2)
    runner = TargetRunner(target, AuxHiddenCapture(target, [0, 1, 2]), use_tree_attention=True)
    longest = max(lengths)
    ids = torch.randint(3, 100, (len(lengths), longest))
    mask = (torch.arange(longest)[None] >= longest - torch.tensor(lengths)[:, None]).long()  # left-padded
    runner.prefill(ids, mask)
    for layer in runner.cache.layers:
        layer.keys = torch.cat([layer.keys, torch.randn(*layer.keys.shape[:2], tree_nodes, layer.keys.shape[3])], 2)
        layer.values = torch.cat([layer.values, torch.randn_like(layer.keys[:, :, -tree_nodes:])], 2)
    runner._tree_start = torch.full_like(runner.seq_lens, longest)
    return runner


def expected_after_commit(runner, accept_local, counts):
    """Per request, per layer: the committed prefix, then the accepted nodes (explicit loops)."""
    out = []
    for layer in runner.cache.layers:
        rows = []
        for b in range(accept_local.shape[0]):
            n, start = int(runner.seq_lens[b]), int(runner._tree_start[b])
            picked = [start + int(i) for i in accept_local[b, :int(counts[b])]]
            rows.append([torch.cat([t[b, :, :n], t[b, :, picked]], 1) for t in (layer.keys, layer.values)])
        out.append(rows)
    return out


def check(runner, expected, counts):
    for layer, rows in zip(runner.cache.layers, expected):
        for b, (keys, values) in enumerate(rows):
            n = int(runner.seq_lens[b])
            assert n == keys.shape[1]
            torch.testing.assert_close(layer.keys[b, :, :n], keys, rtol=0, atol=0)
            torch.testing.assert_close(layer.values[b, :, :n], values, rtol=0, atol=0)


class ScatterCount:
    def __init__(self, monkeypatch):
        self.calls = 0
        scatter = torch.Tensor.scatter_

        def counted(t, *args, **kwargs):
            self.calls += 1
            return scatter(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "scatter_", counted)


@pytest.mark.parametrize("lengths,accept,counts,moves", [
    ([7], [[0, 1, 2, 3]], [4], False),             # a chain accepted whole: already in place
    ([7], [[0, 1, 4, -1]], [3], True),             # a side branch: its node moves
    ([7, 7], [[0, 1, 2, -1], [0, 2, 5, 6]], [3, 4], True),
    ([7, 4], [[0, 1, 2, 3], [0, 1, 2, 3]], [4, 4], True),  # ragged: the short request's nodes move
])
def test_commit_moves_only_what_is_out_of_place(tmp_path, monkeypatch, lengths, accept, counts, moves):
    torch.manual_seed(0)
    runner = runner_with_tree(tmp_path, lengths, tree_nodes=8)
    accept_local, counts = torch.tensor(accept), torch.tensor(counts)
    expected = expected_after_commit(runner, accept_local, counts)
    spy = ScatterCount(monkeypatch)
    runner.commit(accept_local, counts)
    assert (spy.calls > 0) == moves
    assert torch.equal(runner.seq_lens, torch.tensor(lengths) + counts)
    check(runner, expected, counts)
