"""Array backends of the Monte Carlo: NumPy (the default), PyTorch and CuPy, on a CPU or a
CUDA device, through the Python array API standard (``array_api_compat`` namespaces).

The numerical core (:mod:`sigprop.mc.sampling`, :mod:`sigprop.mc.stats`, the components and
:mod:`sigprop.mc.model`) is written once against the standard; a :class:`Backend` supplies
the namespace ``xp``, the device, the moves between the host and the device, and the few
primitives the standard lacks or where a backend has a faster kernel with the same result:

* :meth:`Backend.matmul` with an output array (NumPy writes the product in place; elsewhere
  the product is assigned into ``out``);
* :meth:`Backend.exp_` and :meth:`Backend.mul_`: in-place exponential and in-place product
  with a boolean mask (the standard has neither ``out=`` nor bool-float promotion: the
  generic path returns a new array, which the callers rebind);
* :meth:`Backend.rowdot`: sum over the last axis of a product (NumPy: ``einsum``, one pass;
  the standard: ``vecdot``);
* :meth:`Backend.erf`: the backend's special function where it has one (``torch.special.erf``,
  ``cupyx.scipy.special.erf``); NumPy and namespaces without one use the erfc approximation of
  :mod:`sigprop.backend.numeric` (fractional error < 1.2e-7) written with standard functions.

Random numbers come from :class:`Rng`, a seeded generator shim (the standard has no random
generator).  Its default ``host`` stream draws every number with NumPy's Generator on the host
(Box-Muller float32 normals and raw-bit dropout masks, :mod:`sigprop.mc.sampling`) and moves
it to the device, so every backend sees exactly the same numbers for the same seed; the
``device`` stream uses the backend's own generator (``torch.Generator``, CuPy's
``RandomState``): faster on a GPU, seeded and reproducible on that backend, but another
stream of numbers.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from sigprop.errors import DomainError

BACKENDS = ("numpy", "torch", "cupy")
DEVICES = ("cpu", "cuda")
STREAMS = ("host", "device")


def _compat():
    import array_api_compat

    return array_api_compat


class Backend:
    """One array library on one device.  ``name``: numpy, torch, cupy or the name of another
    standard namespace (tests use ``array_api_strict``); ``xp``: its standard namespace."""

    def __init__(self, name: str, xp, device=None, native=None):
        self.name, self.xp, self.device, self.native = name, xp, device, native
        self.is_numpy = name == "numpy"

    def __repr__(self):
        return f"Backend({self.name}, {self.device_name})"

    def __reduce__(self):
        return (get_backend, (self.name, self.device_name))

    @property
    def device_name(self) -> str:
        if self.name == "torch":
            return self.device.type
        if self.name == "cupy":
            return "cuda"
        return "cpu"

    # --- dtypes and transfers ----------------------------------------------------------------
    def dtype(self, dt):
        """The namespace's dtype for a NumPy dtype (or a dtype of this namespace)."""
        if isinstance(dt, (type, np.dtype, str)) and np.dtype(dt).kind == "f":
            return {4: self.xp.float32, 8: self.xp.float64}[np.dtype(dt).itemsize]
        if isinstance(dt, (type, np.dtype, str)) and np.dtype(dt) == np.bool_:
            return self.xp.bool
        return dt

    def asarray(self, a):
        """A host NumPy array on this backend's device (no copy for NumPy or torch on the CPU)."""
        if self.is_numpy:
            return a
        if self.name == "torch":
            t = self.native.from_numpy(np.ascontiguousarray(a))
            return t if self.device.type == "cpu" else t.to(self.device)
        return self.xp.asarray(a, device=self.device) if self.device is not None else self.xp.asarray(a)

    def to_numpy(self, x) -> np.ndarray:
        if self.is_numpy or isinstance(x, np.ndarray):
            return x
        if self.name == "torch":
            return x.detach().cpu().numpy()
        if self.name == "cupy":
            return x.get()
        return np.asarray(x)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=self.dtype(dtype), device=self.device)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=self.dtype(dtype), device=self.device)

    def tri(self, n: int):
        """Boolean lower triangle (diagonal included), n x n: the causal keep-mask."""
        return self.xp.tril(self.xp.ones((n, n), dtype=self.xp.bool, device=self.device))

    # --- primitives --------------------------------------------------------------------------
    def matmul(self, a, b, out=None):
        if self.is_numpy:
            return np.matmul(a, b, out=out)
        r = self.xp.matmul(a, b)
        if out is None:
            return r
        out[...] = r
        return out

    def exp_(self, x):
        if self.name in ("numpy", "cupy"):
            return self.native.exp(x, out=x)
        if self.name == "torch":
            return x.exp_()
        return self.xp.exp(x)

    def mul_(self, x, mask):
        """x * mask (mask boolean or of x's dtype), in place where the backend allows."""
        if self.is_numpy or self.name == "cupy":
            x *= mask
            return x
        if self.name == "torch":
            return x.mul_(mask)
        return self.mul(x, mask)

    def mul(self, x, mask):
        """x * mask as a new array (mask boolean or of x's dtype)."""
        if self.name in ("numpy", "torch", "cupy"):
            return x * mask
        if mask.dtype == self.xp.bool:
            mask = self.xp.astype(mask, x.dtype)
        return x * mask

    def rowdot(self, a, b):
        """sum_f a[..., f] b[..., f]."""
        if self.is_numpy:
            return np.einsum("...f,...f->...", a, b)
        return self.xp.vecdot(a, b)

    def erf(self, x):
        if self.name == "torch":
            return self.native.special.erf(x)
        if self.name == "cupy":
            from cupyx.scipy.special import erf

            return erf(x)
        return 1.0 - _erfc_approx(self.xp, x)


def _erfc_approx(xp, x):
    """erfc(x) by the Numerical Recipes Chebyshev fit (fractional error < 1.2e-7), standard
    functions only (the same coefficients as :func:`sigprop.backend.numeric.erfc`)."""
    from sigprop.backend.numeric import _ERFC_C

    z = xp.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = xp.zeros_like(z) + _ERFC_C[-1]
    for c in _ERFC_C[-2::-1]:
        poly = poly * t + c
    r = t * xp.exp(-z * z + poly)
    return xp.where(x >= 0, r, 2.0 - r)


@lru_cache(maxsize=None)
def get_backend(name: str = "numpy", device: str = "cpu") -> Backend:
    """The backend ``name`` on ``device`` ('cpu' or 'cuda'); DomainError (one line) when the
    library is not installed or the device is not available."""
    if device not in DEVICES:
        raise DomainError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    if name == "numpy":
        if device != "cpu":
            raise DomainError("the numpy backend runs on the CPU only (--device cpu); use --backend torch or cupy for cuda")
        return Backend("numpy", _compat().array_namespace(np.empty(0)), None, np)
    if name == "torch":
        try:
            import torch
        except ImportError:
            raise DomainError("--backend torch needs PyTorch: pip install 'sigprop[torch]' (or a CUDA build of torch)") from None
        if device == "cuda" and not torch.cuda.is_available():
            raise DomainError("--device cuda: PyTorch sees no CUDA device here")
        dev = torch.device("cuda" if device == "cuda" else "cpu")
        return Backend("torch", _compat().array_namespace(torch.empty(0)), dev, torch)
    if name == "cupy":
        if device != "cuda":
            raise DomainError("the cupy backend runs on a CUDA device only (--device cuda)")
        try:
            import cupy
        except ImportError:
            raise DomainError("--backend cupy needs CuPy (pip install cupy-cuda12x or the build for your CUDA)") from None
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise DomainError("--backend cupy: no CUDA device here")
        except cupy.cuda.runtime.CUDARuntimeError:
            raise DomainError("--backend cupy: no CUDA device here") from None
        return Backend("cupy", _compat().array_namespace(cupy.empty(0)), None, cupy)
    if name == "array_api_strict":       # the tests' check that the core uses only the standard
        import array_api_strict

        return Backend("array_api_strict", array_api_strict, None, array_api_strict)
    raise DomainError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")


NUMPY = None


def numpy_backend() -> Backend:
    global NUMPY
    if NUMPY is None:
        NUMPY = get_backend("numpy", "cpu")
    return NUMPY


def backend_of(x) -> Backend:
    """The backend an array belongs to."""
    if isinstance(x, np.ndarray):
        return numpy_backend()
    c = _compat()
    if c.is_torch_array(x):
        return get_backend("torch", "cuda" if x.device.type == "cuda" else "cpu")
    if c.is_cupy_array(x):
        return get_backend("cupy", "cuda")
    if type(x).__module__.startswith("array_api_strict"):
        return get_backend("array_api_strict", "cpu")
    raise DomainError(f"unsupported array type {type(x).__name__}")


def np_dtype(dt) -> type:
    """The NumPy scalar type of a dtype of any backend (float32 or float64)."""
    if isinstance(dt, (type, np.dtype, str)):
        return np.dtype(dt).type
    s = str(dt).rsplit(".", 1)[-1]
    if "float32" in s:
        return np.float32
    if "float64" in s:
        return np.float64
    raise DomainError(f"unsupported dtype {dt}")


class Rng:
    """Seeded random source of one backend (the standard has no random generator).

    ``gen``: the host NumPy Generator (built from ``seed``, an int or a SeedSequence, unless
    given); ``stream``: 'host' (NumPy's numbers moved to the device: the same numbers on every
    backend) or 'device' (the backend's own generator, seeded from the same seed; NumPy has no
    other, so for it the two are one).  Host-side bookkeeping (the embedding's token ids) always
    draws from ``gen``."""

    def __init__(self, seed=0, backend: Backend | None = None, stream: str = "host",
                 gen: np.random.Generator | None = None):
        if stream not in STREAMS:
            raise DomainError(f"unknown random stream {stream!r}; known: {', '.join(STREAMS)}")
        self.backend = backend or numpy_backend()
        self.seed = seed
        self.gen = gen if gen is not None else np.random.default_rng(seed)
        self.stream = "host" if self.backend.is_numpy else stream
        self._dev = None
        if self.stream == "device":
            ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
            entropy = int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))      # a 63-bit seed
            bk = self.backend
            if bk.name == "torch":
                self._dev = bk.native.Generator(device=bk.device).manual_seed(entropy)
            elif bk.name == "cupy":
                self._dev = bk.native.random.RandomState(entropy % 2**32)
            else:
                self.stream = "host"

    @property
    def bit_generator(self):
        return self.gen.bit_generator

    # --- draws on the backend ----------------------------------------------------------------
    def normal(self, shape, dtype=np.float32):
        """iid N(0, 1) of ``shape`` on the device (float32: the Box-Muller kernel of
        :func:`sigprop.mc.sampling.standard_normal`; else NumPy's ``standard_normal``)."""
        from sigprop.mc.sampling import _host_standard_normal

        dt = np_dtype(dtype)
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        if self._dev is not None:
            return self._device_normal(shape, dt)
        return self.backend.asarray(_host_standard_normal(self.gen, shape, dt))

    def keep(self, shape, p: float):
        """Boolean dropout keep-mask, True with probability 1 - p."""
        from sigprop.mc.sampling import _host_keep_mask

        shape = tuple(shape)
        if self._dev is not None:
            bk = self.backend
            if bk.name == "torch":
                u = bk.native.rand(shape, generator=self._dev, device=bk.device)
            else:
                u = self._dev.random_sample(shape, dtype=np.float32)
            return u >= p
        return self.backend.asarray(_host_keep_mask(self.gen, shape, p))

    def standard_normal(self, shape, dtype=np.float64):
        """NumPy Generator.standard_normal semantics (its ziggurat), on the device."""
        dt = np_dtype(dtype)
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        if self._dev is not None:
            return self._device_normal(shape, dt)
        return self.backend.asarray(self.gen.standard_normal(shape, dtype=dt))

    def _device_normal(self, shape, dt):
        bk = self.backend
        if bk.name == "torch":
            return bk.native.randn(shape, generator=self._dev, dtype=bk.dtype(dt), device=bk.device)
        return self._dev.standard_normal(shape, dtype=dt)

    # --- host draws --------------------------------------------------------------------------
    def random(self, shape=None):
        """Uniforms in [0, 1) on the host (float64 NumPy array)."""
        return self.gen.random(shape)


def as_rng(rng, backend: Backend | None = None) -> Rng:
    """An :class:`Rng` from an Rng, a NumPy Generator (NumPy backend unless ``backend``), an
    int seed or None (seed 0)."""
    if isinstance(rng, Rng):
        return rng
    if isinstance(rng, np.random.Generator):
        return Rng(None, backend, gen=rng)
    return Rng(0 if rng is None else rng, backend)

