"""The choice types and help of the simulation options (check, check-component, plot), each defined once."""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"


class ArrayBackend(str, Enum):
    numpy = "numpy"
    torch = "torch"
    cupy = "cupy"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Stream(str, Enum):
    host = "host"
    device = "device"


BACKEND_HELP = "Array library of the simulation (torch and cupy when installed)."
DEVICE_HELP = "Device of the simulation's arrays (cuda: torch or cupy)."
RNG_HELP = ("Random numbers: host = NumPy's generator, moved to the device (the same numbers on every backend); "
            "device = the backend's own generator (faster on a GPU, another stream).")
DASK_HELP = "Run the independent trials on a Dask cluster: a scheduler address (tcp://host:8786) or 'local'."
WORKERS_HELP = "With --dask local (implied when given alone): worker processes of the local cluster."


class Optimizer(str, Enum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"
