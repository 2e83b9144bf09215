"""renaissance_nb: a Jupyter-first static-graph deep-learning trainer and plan inspector.

Declare a model as a BluePrint, build a DeepLearningTask, and step it through
PLANNING -> MEMORY_LOCKED -> COMPILED; training then replays the compiled step.
"""
from . import jit_cache  # noqa: F401 - first: it stamps numba's cache of every kernel (see jit_cache.py)
from . import datasets
from .blueprint import *  # noqa: F401,F403 - BluePrint, seq/repeat/add2 and every op's builder (ops.__all__)
from .blueprint import __all__ as BLUEPRINT_NAMES
from .errors import (BluePrintError, CheckpointError, ConfigError, DataError, DeviceError, DownloadError,
                     ExportError, NumericalError, PhaseError, PlanError, RenaissanceError, ShapeError)
from .compiler.atlas import GraphAtlas
from .compiler.graph import ComputationGraph, GraphNode, node
from .compiler.ids import GraphId, StreamKind
from .memory.dtensor import DTensor
from .memory.plan import MemoryPlan
from .memory.region import Region
from .result import EpochRecord, TrainingResult
from .phases import Phase
from .task import DeepLearningTask
from .taskbase import TaskBase
from .config import TaskConfig
from .runtime import checkpoint
from .train.losses import CrossEntropyLoss
from .train.optimizers import LARS, SGD, Adam, AdamW
from .train.callbacks import EarlyStopping, StopTraining
from .train.plateau import ReduceLROnPlateau
from .train.schedulers import (ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, ExponentialLR,
                               LinearLR, MultiStepLR, OneCycleLR, PolynomialLR, Scheduler, StepLR)
from .train.wsd import WarmupStableDecayLR

__version__ = "0.1.0"

__all__ = [
    "datasets", *(n for n in BLUEPRINT_NAMES if n not in ("LAYER_BUILDERS", "SIZE_MAX", "Add2", "Layer", "Named",
                                                          "Repeat", "Seq")),
    "DeepLearningTask", "TaskBase", "Phase", "BluePrintError", "CheckpointError",
    "ConfigError", "DataError", "DeviceError", "DownloadError", "ExportError", "NumericalError", "PhaseError", "PlanError",
    "RenaissanceError", "ShapeError", "GraphAtlas", "ComputationGraph", "GraphNode", "node", "GraphId", "StreamKind", "DTensor",
    "MemoryPlan", "Region", "EpochRecord", "TrainingResult", "CrossEntropyLoss", "SGD", "Adam", "AdamW", "LARS",
    "ConstantLR", "CosineAnnealingLR", "ExponentialLR", "MultiStepLR", "PolynomialLR", "Scheduler", "StepLR",
    "TaskConfig", "checkpoint", "LinearLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "ReduceLROnPlateau", "EarlyStopping", "StopTraining",
    "WarmupStableDecayLR",
]
