"""histocal.distributed on a two-node Ray cluster (``ray.cluster_utils.Cluster``): a node removed
while its worker runs a shard; the shard is redone on the other node and the merged state is still
the single-process one."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time

import onnx
import pytest
import ray
from ray.cluster_utils import Cluster
from support import models
from test_distributed import FEEDS, assert_same_state, single_run

from histocal.distributed import calibrate_distributed

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.WARNING)
    yield cluster, node
    ray.shutdown()
    cluster.shutdown()


def stalls_on(node_id, marker, feeds):
    """Feeds; on node ``node_id``, the first time, it signals ``marker`` and waits (for the node
    to be removed under it)."""
    if ray.get_runtime_context().get_node_id() == node_id and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(120)
    yield from feeds


def test_a_removed_node_s_shard_is_redone_and_the_state_is_identical(two_nodes, tmp_path):
    cluster, node = two_nodes
    model_path = (tmp_path / "cnn.onnx").as_posix()
    onnx.save(models.cnn(), model_path)
    marker = (tmp_path / "stalled").as_posix()
    shards = [functools.partial(stalls_on, node.node_id, marker, FEEDS[i : i + 2]) for i in range(0, 8, 2)]
    outcome: dict = {}

    def run():
        try:
            outcome["state"] = calibrate_distributed(model_path, shards, calibrate_method="entropy", num_workers=2)
        except BaseException as exc:  # reported by the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert os.path.exists(marker), f"no shard reached the second node: {outcome}"
    cluster.remove_node(node)
    thread.join(180)
    assert not thread.is_alive(), "the run did not finish after the node was removed"
    assert "error" not in outcome, outcome.get("error")
    assert_same_state(outcome["state"], single_run(model_path, "entropy"))
