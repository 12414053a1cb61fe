"""The test suite (a package, so that the tests in its sub-folders import their shared helpers
as ``tests._cli``, ``tests._paths``, ``tests._torch_configs`` and ``tests.conftest``)."""
