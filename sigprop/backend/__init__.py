"""Math namespaces that rules are written against.

A rule is a plain function of a namespace ``m`` (``m.exp``, ``m.sqrt``, ``m.acos``,
``m.pi``, ``m.expect_normal`` ...).  With :data:`numeric` it evaluates on floats and NumPy
arrays (broadcasting over configurations); with :mod:`sigprop.backend.symbolic` (imported explicitly, it pulls
in sympy) the very same function returns sympy expressions that can be simplified, solved
and printed as LaTeX.  That is how no formula is ever typed twice.

Numeric integration primitives put their quadrature axis *first* (shape
``(n_nodes,) + broadcast_shape``), so that closures capturing per-configuration arrays of
shape ``broadcast_shape`` broadcast correctly, also when integrals are nested.
"""

from sigprop.backend import numeric  # noqa: F401  (numpy only)

# The sympy namespace is the submodule ``sigprop.backend.symbolic``; import it explicitly
# (``import sigprop.backend.symbolic as sm``) where formulas are wanted: it pulls in sympy.
