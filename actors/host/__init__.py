"""kvres.actors.host: one backend's sessions on one engine, kept under budget.

``BackendHost`` (``backend.py``) is the facade; each other module is one part of it (see its
docstring). Plain classes: no Ray.
"""
