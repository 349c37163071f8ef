"""A model module outside the package whose own import fails (a dependency it lacks): refused
naming the module and the error, not as a module missing from the Python path
(tests/models/test_external.py)."""
import missing_dep  # noqa: F401
