"""Whole models: the resolved specification (:mod:`~sigprop.model.spec`), the architecture
and initialisation presets that produce it (:mod:`~sigprop.model.presets`,
:mod:`~sigprop.model.deepnorm`), TOML option files (:mod:`~sigprop.model.config`), and the
prediction engine that consumes it (:mod:`~sigprop.model.predict`).

The names below are served from their modules on first use, so that importing one submodule
(the table store, say) does not import the specification and the presets."""

#: name -> the submodule that defines it
_NAMES = {"WEIGHTS": "spec", "Dropout": "spec", "Model": "spec", "Sublayers": "spec",
          "ARCH_NAMES": "presets", "INIT_NAMES": "presets", "resolve": "presets"}


def __getattr__(name: str):
    if name in _NAMES:
        from importlib import import_module

        value = getattr(import_module(f"sigprop.model.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sigprop.model' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
