"""kvres.actors.engines.registry."""
