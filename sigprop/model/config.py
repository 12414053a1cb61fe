"""Model options from a TOML file, for the CLI's ``--config``: defaults < config file < flags.

The keys are the command line's option names without their leading ``--`` (``layers``,
``heads``, ``d-model``, ...; dashes or underscores), at the top level::

    arch = "postln"
    layers = 96
    d-model = 256
    dropout = 0.0
    causal = true

The names of :func:`sigprop.model.presets.resolve` (``n-layers``, ``n-heads``) are accepted
too.  Every key and value is checked (unknown key, wrong type, out of range: DomainError naming
the file and the key).  The result maps canonical option names (``n_layers``, ``d_model``,
...) to values, ready for ``presets.resolve(**options)``.
"""

from __future__ import annotations

from pathlib import Path

from sigprop.errors import DomainError
from sigprop.model.presets import OPTIONS, canonical_name


def load_config(path) -> dict:
    """Read and validate a TOML options file; returns {canonical option name: value}."""
    from sigprop.files import check_path, read_toml

    path = Path(check_path(path, "config file"))
    return check_config(read_toml(path, "config file"), path.name)


def check_config(data: dict, where: str = "config") -> dict:
    """Validate a parsed config mapping (see :func:`load_config`)."""
    out: dict = {}
    given_as: dict = {}
    for key, value in data.items():
        name = canonical_name(key)
        if name is None:
            raise DomainError(f"{where}: unknown key {key!r}; known: "
                              f"{', '.join(o.flag[2:] for o in OPTIONS.values())} (dashes or underscores)")
        if name in out:
            raise DomainError(f"{where}: key {key!r} repeats {given_as[name]!r}")
        if isinstance(value, dict):
            raise DomainError(f"{where}: key {key!r} must be a value, not a table")
        if isinstance(value, list):
            raise DomainError(f"{where}: key {key!r} must be a single value, not an array")
        opt = OPTIONS[name]
        if opt.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if opt.type is int and isinstance(value, float):
            raise DomainError(f"{where}: {key} must be an integer, got {value!r}")
        out[name] = opt.check(value, key, f"{where}: ")
        given_as[name] = key
    return out
