"""kvres.actors.host."""
