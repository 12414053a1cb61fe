"""Whole models: the resolved specification (:mod:`~sigprop.model.spec`), the architecture
and initialisation presets that produce it (:mod:`~sigprop.model.presets`,
:mod:`~sigprop.model.deepnorm`), TOML option files (:mod:`~sigprop.model.config`), and the
prediction engine that consumes it (:mod:`~sigprop.model.predict`)."""

from sigprop.model.spec import WEIGHTS, Dropout, Model, Sublayers  # noqa: F401
from sigprop.model.presets import ARCH_NAMES, INIT_NAMES, resolve  # noqa: F401
