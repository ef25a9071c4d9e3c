"""Exact mode's second read of the data is verified to be the first read again: a digest of every
feed (input names, dtypes, shapes and bytes) taken on the first read is compared on the second, so
a reader that yields the same batches in another order (a rewound shuffling loader), repeats one
or changes one refuses with an error naming the batches, instead of counting batches twice or
never. Through the calibrator class, ``histocal.quantize_static``, onnxruntime's patched
``quantize_static`` and the distributed passes (``split_exact``); a reader that yields the same
feeds in the same order still gives onnxruntime's result.
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import models
from support.calibrator_runs import DIST, ORT_QUANTIZE, PCT, RewindReader, assert_tensors_same, make_histocal, run_ort
from support.parity import quiet

import histocal
from histocal.calibrators import budget as hb
from histocal.calibrators.common import ReadDigest
from histocal.calibrators.split_exact import count_exact, scan_exact

SAME_ORDER = "same feeds in the same order"


class ReorderingReader(RewindReader):
    """A reader with rewind() whose reads yield its feeds in the orders given, one per read
    (the last one again after that): a shuffling loader that reshuffles when rewound."""

    def __init__(self, feeds, *orders):
        super().__init__(feeds)
        self.all, self.orders, self.read_count = list(feeds), [list(o) for o in orders], 0
        self.rewind()

    def rewind(self):
        super().rewind()
        order = self.orders[min(self.read_count, len(self.orders) - 1)]
        self.feeds = [self.all[j] for j in order]
        self.read_count += 1


def kept_budget(cal, feed, k: int) -> int:
    """A memory budget that keeps the outputs of ``k`` batches like ``feed`` (and not k + 1)."""
    outputs = cal.infer_session.run(cal.fetch_names(), feed)
    one = sum(a.nbytes + hb.KEPT_ARRAY_OVERHEAD for a in outputs)
    return k * one + one // 2


def span_of(error: BaseException) -> tuple[int, int]:
    found = re.match(r"batch(?:es)? (\d+)(?: to (\d+))?:", str(error))
    assert found, str(error)
    return int(found[1]), int(found[2] or found[1])


@pytest.mark.parity
@settings(max_examples=25, deadline=None)
@given(
    order=st.integers(2, 7).flatmap(lambda n: st.permutations(range(n))),
    kept=st.integers(0, 7),
    seed=st.integers(0, 2**16),
)
def test_a_reader_that_reorders_on_its_second_read_is_orts_or_refused(paths, tmp_path_factory, order, kept, seed):
    """Any budget (none, some or all batches kept) and any order of the second read: onnxruntime's
    result where nothing is read again or the order is the same, else an error naming the batches."""
    n, kept = len(order), min(kept, len(order))
    rng = np.random.default_rng(seed)
    feeds = [{"X": (rng.normal(size=(3, 4)) * (1 + i)).astype(np.float32)} for i in range(n)]
    tmp = tmp_path_factory.mktemp("reorder")
    ref = run_ort(paths["passthrough"], DIST, {"num_bins": 512}, [feeds], tmp / "o.onnx")
    cal = make_histocal(paths["passthrough"], DIST, {"num_bins": 512}, tmp / "h.onnx")
    cal.memory_budget = kept_budget(cal, feeds[0], kept)
    reader = ReorderingReader(feeds, range(n), order)
    if kept == n or list(order) == list(range(n)):
        with quiet():
            cal.collect_data(reader)
            assert_tensors_same(ref.td, cal.compute_data(), f"kept {kept}, second read {order}")
        return
    with quiet(), pytest.raises(ValueError, match=SAME_ORDER) as err:
        cal.collect_data(reader)
    first_moved = next(i for i, j in enumerate(order) if i != j)
    first, last = span_of(err.value)
    assert first <= first_moved <= last < n, str(err.value)


def _relu_model(path):
    import onnx
    from onnx import TensorProto, helper

    shape = ["N", 4, 8]
    g = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


@pytest.mark.parity
def test_the_reported_shuffling_loader_is_refused_and_the_same_order_is_orts(tmp_path):
    """The report's case: 12 batches, an 8k budget that keeps some, a loader reshuffling on
    rewind() (it gave Distribution avg 2.4957 where onnxruntime gives 2.5649, without an error)."""
    path = _relu_model((tmp_path / "relu.onnx").as_posix())
    rng = np.random.default_rng(0)
    feeds = [{"X": (rng.normal(size=(4, 4, 8)) * (1 + i)).astype(np.float32)} for i in range(12)]
    shuffle = np.random.default_rng(7)
    cal = histocal.DistributionCalibrater(path, num_bins=512, memory_budget="8k")
    cal.augment_graph()
    cal.create_inference_session()
    with quiet(), pytest.raises(ValueError, match=SAME_ORDER) as err:
        cal.collect_data(ReorderingReader(feeds, shuffle.permutation(12), shuffle.permutation(12)))
    assert "second read" in str(err.value) and "streaming" in str(err.value)
    span_of(err.value)
    ref = run_ort(path, DIST, {"num_bins": 512}, [feeds], tmp_path / "o.onnx")
    order = shuffle.permutation(12)
    ours = histocal.DistributionCalibrater(path, num_bins=512, memory_budget="8k")
    ours.augment_graph()
    ours.create_inference_session()
    with quiet():
        ours.collect_data(ReorderingReader(feeds, order, order))  # shuffled once, the same each read
        assert_tensors_same(ref.td, ours.compute_data(), "same order each read")


@pytest.mark.parametrize("k,kept", [(0, 0), (3, 0), (13, 0), (38, 0), (2, 5), (13, 4), (38, 7)])
def test_a_batch_replaced_by_another_names_where(paths, tmp_path, k, kept):
    """A second read that repeats batch k + 1 in place of batch k (same shapes, same count: one
    batch would be counted twice, one never) fails naming a span of batches that holds k, a kept
    batch's place included, and before running past batch 2k + 1."""
    feeds = [{"X": np.full((2, 4), i, np.float32)} for i in range(40)]
    second = list(range(40))
    second[k] = k + 1
    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "a.onnx")
    cal.memory_budget = kept_budget(cal, feeds[0], kept)
    reader = ReorderingReader(feeds, range(40), second)
    with quiet(), pytest.raises(ValueError, match="different data on its second read") as err:
        cal.collect_data(reader)
    first, last = span_of(err.value)
    assert first <= k <= last <= 2 * k + 1, str(err.value)
    assert reader.i == last + 1  # refused on reading it: the batches after it were not read


@pytest.mark.parity
def test_histocal_quantize_static_refuses_a_reordering_reader(paths, tmp_path):
    feeds = models.cnn_feeds(6)
    with quiet():
        probe = make_histocal(paths["cnn"], PCT, {}, tmp_path / "p.onnx")
        budget = kept_budget(probe, feeds[0], 2)
        with pytest.raises(ValueError, match=SAME_ORDER):
            histocal.quantize_static(
                paths["cnn"],
                (tmp_path / "h.onnx").as_posix(),
                ReorderingReader(feeds, range(6), [0, 1, 5, 3, 4, 2]),
                calibrate_method=PCT,
                memory_budget=budget,
            )
        # the same order on each read: onnxruntime's quantized model
        ORT_QUANTIZE.quantize_static(
            paths["cnn"], (tmp_path / "o.onnx").as_posix(), RewindReader(feeds), calibrate_method=PCT
        )
        histocal.quantize_static(
            paths["cnn"],
            (tmp_path / "s.onnx").as_posix(),
            RewindReader(feeds),
            calibrate_method=PCT,
            memory_budget=budget,
        )
    assert (tmp_path / "o.onnx").read_bytes() == (tmp_path / "s.onnx").read_bytes()


@pytest.mark.parity
def test_patched_quantize_static_refuses_a_reordering_reader(paths, tmp_path, monkeypatch):
    """onnxruntime's quantize_static with histocal patched in, the budget set through the
    environment (its only way there)."""
    feeds = models.cnn_feeds(6)
    with quiet():
        probe = make_histocal(paths["cnn"], DIST, {}, tmp_path / "p.onnx")
        monkeypatch.setenv(hb.MEMORY_BUDGET_ENV, str(kept_budget(probe, feeds[0], 3)))
        with histocal.patch_onnxruntime(), pytest.raises(ValueError, match=SAME_ORDER):
            ORT_QUANTIZE.quantize_static(
                paths["cnn"],
                (tmp_path / "h.onnx").as_posix(),
                ReorderingReader(feeds, range(6), [1, 0, 2, 3, 4, 5]),
                calibrate_method=DIST,
            )


def test_distributed_passes_refuse_a_shard_read_in_another_order(paths, tmp_path):
    """histocal.distributed's two passes over one shard (scan_exact, count_exact) check the
    shard's second read the same way."""
    rng = np.random.default_rng(3)
    feeds = [{"X": (rng.normal(size=(2, 4)) * (1 + i)).astype(np.float32)} for i in range(9)]
    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "a.onnx")
    with quiet():
        reader = ReorderingReader(feeds, range(9), [0, 1, 2, 3, 4, 5, 6, 8, 7])
        part = scan_exact(cal, reader)
        reader.rewind()  # a worker opens the shard again for its second pass
        with pytest.raises(ValueError, match=SAME_ORDER) as err:
            count_exact(cal, reader, part, part.scans)
        first, last = span_of(err.value)
        assert first <= 7 <= last, str(err.value)
        same = RewindReader(feeds)
        part = scan_exact(cal, same)
        same.rewind()
        count_exact(cal, same, part, part.scans)


def test_the_digest_covers_names_dtypes_shapes_and_bytes():
    base = {"X": np.arange(12, dtype=np.float32).reshape(3, 4), "M": np.ones((3,), np.int64)}

    def digest(*feeds):
        d = ReadDigest()
        for feed in feeds:
            d.add(feed)
        return d.digest

    same = {"M": np.ones((3,), np.int64), "X": np.arange(12, dtype=np.float32).reshape(3, 4)}
    assert digest(base) == digest(same)  # the dict's order does not matter
    strided = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2] // 2
    assert digest({**base, "X": strided}) == digest({**base, "X": np.ascontiguousarray(strided)})
    changed = [
        {**base, "X": base["X"].reshape(4, 3)},  # shape
        {**base, "X": base["X"].view(np.int32)},  # dtype, same bytes
        {"Y": base["X"], "M": base["M"]},  # name
        {**base, "X": base["X"] + np.float32(1e-6) * (base["X"] == 5)},  # one value
    ]
    assert len({digest(base), *(digest(f) for f in changed)}) == 1 + len(changed)
    a, b = {**base, "X": base["X"] * 2}, base
    assert digest(a, b) != digest(b, a)  # the order of the batches
    read = ReadDigest()
    for feed in (a, b, a):
        read.add(feed)
    assert pickle.loads(pickle.dumps(read)).__dict__ == read.__dict__  # travels to distributed workers
