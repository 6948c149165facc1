"""kvres.actors.sizing."""
