"""Regions and GraphIds of the original that no model fills are marked reserved, and none is filled."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (LARS, RESNET_3_3, AdamW, CrossEntropyLoss, DeepLearningTask, GraphId, Region, avgpool,
                            block, bn, cbr, conv, dropout, fc, flatten, gap, maxpool, relu, seq)
from renaissance_nb.memory.region import RESERVED


@pytest.fixture(scope="module")
def locked_tasks() -> list[DeepLearningTask]:
    """An MLP with every training feature, a conv net and a ResNet block net (image augmentation, EMA; LARS, whose
    norms fill the N regions and LARS_NORMS), and both again in mixed precision (A, G_*_FP16, F_*_FP16, E_*_FP16)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 20)).astype(np.float32), rng.integers(0, 4, 64)
    images = rng.standard_normal((64, 3, 8, 8)).astype(np.float32)
    mlp = (DeepLearningTask("mlp").model(seq(fc(16), relu(), dropout(0.2), fc(4)))
           .data(train=(x, y), batch_size=16, val_fraction=0.25).ema(0.9).clip_grad_norm(1.0)
           .loss(CrossEntropyLoss(weight=[1, 2, 1, 1])).optimizer(AdamW()))
    nets = [DeepLearningTask(name).model(bp).data(train=(images, y), batch_size=16, val_fraction=0.25).ema(0.9)
            .augment(crop_pad=1, flip=True).optimizer(LARS() if name == "resnet_lars" else AdamW()) for name, bp in
            (("resnet", seq(cbr(4, 3, 1, 1), maxpool(2, 2), block(4, RESNET_3_3), gap(), fc(4))),
             ("conv", seq(conv(4, 3, 1, 1), bn(), relu(), avgpool(2, 2), flatten(), fc(4))),
             ("resnet_lars", seq(cbr(4, 3, 1, 1), maxpool(2, 2), block(4, RESNET_3_3), gap(), fc(4))))]
    amp = [DeepLearningTask("mlp_bf16").model(seq(fc(16), relu(), dropout(0.2), fc(4)))
           .data(train=(x, y), batch_size=16, val_fraction=0.25).ema(0.9).clip_grad_norm(1.0).precision("bf16"),
           DeepLearningTask("resnet_fp16").model(seq(cbr(4, 3, 1, 1), maxpool(2, 2), block(4, RESNET_3_3), gap(), fc(4)))
           .data(train=(images, y), batch_size=16, val_fraction=0.25).ema(0.9).precision("fp16")]
    return [t.lock_memory() for t in [mlp, *nets, *amp]]


def test_no_model_allocates_in_a_reserved_region_and_every_other_region_is_used(locked_tasks) -> None:
    used = {t.region for task in locked_tasks for t in task.memory}
    assert not used & set(RESERVED)
    assert used | set(RESERVED) == set(Region) - {Region.END}  # the reserved list is exactly what is unused
    assert Region.S_SCALAR_FP16.reserved_for and Region.A_FC_WEIGHT.reserved_for is None  # mixed precision fills A
    assert not any(r.reserved_for for r in Region if r.family == "N")  # LARS fills them


def test_no_graph_puts_a_node_in_a_reserved_graph_id(locked_tasks) -> None:
    for task in locked_tasks:
        for graph in (task.graphs.train, task.graphs.inference):
            filled = {gid for gid in GraphId if graph.nodes(gid)}
            assert not {g for g in filled if g.reserved_for}, task.name
    assert GraphId.FIRST_COMM.reserved_for and GraphId.OPTIMIZER.reserved_for is None
    assert GraphId.DEEP_COMM.reserved_for is None  # filled by a distributed task
    assert GraphId.LARS_NORMS.reserved_for is None and locked_tasks[3].graphs.train.nodes(GraphId.LARS_NORMS)


def test_a_distributed_plan_fills_deep_comm_with_one_all_reduce_of_the_gradient_region(locked_tasks) -> None:
    mlp = locked_tasks[0]
    assert not mlp.graphs.train.nodes(GraphId.DEEP_COMM)  # one process: nothing to reduce
    two = DeepLearningTask(config=mlp.config.with_(distributed="mpi", ranks=2, allreduce="slab")).lock_memory()
    (node,) = two.graphs.train.nodes(GraphId.DEEP_COMM)  # as under mpiexec -n 2, the one-slab option
    assert (node.op, node.p["first"], node.p["last"], node.p["ranks"]) == ("allreduce_mean", "G_BN_BIAS",
                                                                          "G_DEEP_CONV", 2)
    a, b = two.memory.region_range(Region.G_BN_BIAS, Region.G_DEEP_CONV)
    grads = [t for t in two.memory if t.region.family == "G"]
    assert grads and all(a <= t.offset < b for t in grads)  # the slab holds every gradient
    assert two.planned.shapes.specs["train_base"].batch == 8  # the global batch 16 split over 2 ranks
