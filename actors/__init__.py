"""kvres.actors: engine mechanisms behind the executor protocol, and the Ray actors that own them.

Importing this package loads no engine and no Ray; each submodule imports what it needs.
"""
