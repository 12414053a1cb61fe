"""sigprop: analytic signal propagation for deep transformers.

Every component of a transformer has a moment rule (forward mean/variance/token
correlation, backward gradient variance/correlation), written once against a small
math namespace (:mod:`sigprop.backend`) so the same definition evaluates as fast NumPy
code or as a sympy expression.  Importing this package never imports sympy.
"""

__version__ = "0.1.0"
