"""`sigprop predict` without typer: the command's work (:func:`run`), and a parser for the
plain command lines (:func:`parse`) that lets :func:`sigprop.cli.main` skip typer's import
and command construction (a third of a `predict --json` run's start-up beyond NumPy).

:func:`parse` takes only what typer would read the same way: the model options of
:data:`sigprop.model.options.OPTIONS` (``--name VALUE``, ``--name=VALUE``; a switch as
``--name`` / ``--no-name``), ``--config``, ``--spec``, ``--hf-config``, ``--every``,
``--full``, ``--json`` and ``--symbolic``, each value converted as typer converts it (``int()``,
``float()``, a path).  Anything else (help, ``--version``, an unknown or misspelt option, a
value that does not convert, a missing value, a positional argument, ``--``) returns None and
the command line goes to typer, which parses it or reports the error.
"""

from __future__ import annotations


def _flags() -> dict:
    """flag -> (parameter name, type, value for a switch)."""
    from pathlib import Path

    from sigprop.model.options import OPTIONS

    out = {}
    for name, o in OPTIONS.items():
        if o.type is bool:
            out[o.flag] = (name, bool, True)
            out["--no-" + o.flag[2:]] = (name, bool, False)
        else:
            out[o.flag] = (name, o.type, None)
    for name in ("config", "spec", "hf_config"):
        out["--" + name.replace("_", "-")] = (name, Path, None)
    out["--every"] = ("every", int, None)
    out["--full"] = ("full", bool, True)
    out["--json"] = ("as_json", bool, True)
    out["--symbolic"] = ("symbolic", bool, True)
    return out


def parse(args: list[str]) -> dict | None:
    """The keyword arguments of :func:`run` for the options ``args`` of `sigprop predict`
    (after the command name), or None when typer should parse them (module docstring).  An
    option given twice keeps its last value, as in typer."""
    flags = _flags()
    given: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        spec = flags.get(flag)
        if spec is None:
            return None
        name, kind, switch = spec
        if kind is bool:
            if eq:
                return None
            given[name] = switch
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        if not value or value.startswith("-") and kind not in (int, float):
            return None
        try:
            given[name] = kind(value)
        except ValueError:
            return None
    every = given.pop("every", None)
    if every is not None and every < 1:
        return None
    as_json = given.pop("as_json", False)
    symbolic = given.pop("symbolic", False)
    full = given.pop("full", False)
    return {"model_opts": given, "every": every, "as_json": as_json, "symbolic": symbolic, "full": full}


def run(model_opts: dict, every: int | None = None, as_json: bool = False, symbolic: bool = False,
        full: bool = False) -> None:
    """Predict the model of ``model_opts`` (options as given, see
    :func:`sigprop.model.options.build_model`) and print its trace: text, or JSON with
    ``as_json``; ``symbolic`` adds the derived closed forms; ``every``: only every K-th layer
    (and the input and the top layer); text without ``every``: about 40 rows, or every row with
    ``full`` (:mod:`sigprop.cli._render_rows`); the summary comes first.  Then the time it
    took, on stderr (:func:`sigprop.cli._report.done`)."""
    from sigprop.cli import _render_rows
    from sigprop.cli._report import done
    from sigprop.model.options import build_model

    _render_rows.conflict(every, full)
    model = build_model(model_opts, default_layers=24, encdec=True)
    from sigprop.model.encdec import is_encdec

    if is_encdec(model):
        from sigprop.cli._render_encdec import predict_encdec

        if symbolic:
            from sigprop.model.encdec import refuse

            refuse(model, "--symbolic")
        predict_encdec(model, every, as_json, full)
        done()
        return
    if symbolic:
        from sigprop.model.symbolic import require_supported

        require_supported(model)
    from sigprop.model.predict import predict
    from sigprop.model.trace import trace_text

    points = predict(model, stop_at_saturation=True)
    # the derivation needs the whole model inside the rules' domain: a saturating softmax
    # gives the trace up to there (symbolic: null), as without --symbolic
    derivable = points.saturation_layer is None
    if symbolic and not as_json and derivable:
        from sigprop.cli._render_model import render_symbolic

        render_symbolic(model)
        done()
        return
    if as_json:
        extra = {"hf": model.notes["hf"]} if "hf" in model.notes else None
        if symbolic:
            from sigprop.model import symbolic as sym

            extra = {**(extra or {}), "symbolic": sym.to_json(sym.derive(model)) if derivable else None}
        print(trace_text(model, points, every or 1, extra))
        done()
        return
    from sigprop.cli._render_model import render_trace
    from sigprop.model.trace import point_json, summary

    rows = _render_rows.select([p.layer for p in points], every, full)
    tr = {"points": [point_json(p, False) for p in points if rows.keep(p.layer)], "summary": summary(points)}
    if symbolic:
        print(f"no closed forms: the softmax saturates at layer {points.saturation_layer}, outside the rules' "
              "domain; the trace up to there:")
    render_trace(model, tr, rows.line)
    done()
